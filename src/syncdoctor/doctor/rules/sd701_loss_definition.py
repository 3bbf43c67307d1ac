from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules._thresholds import OFFSET_MIN, OFFSET_SAME_SIDE, OFFSET_T
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import describe_split, majority_outliers
from syncdoctor.rulebook import fmt_ranks


class LossDefinitionMismatch(Rule):
    """Ranks compute different losses: loss code or hyperparameters differ.

    **Symptom:** per-rank losses sit at persistent offsets from each other while
    the gradients are averaged normally; looks like a comm fault (e.g. an
    asymmetric loss with margin 0.05 on some cards and 0.1 on others).

    **Cause:** different loss implementations or settings per rank — a code
    package updated on some nodes only, rank-dependent config, a different mask.

    **Quick check:** print the loss module's hyperparameters and the code version on every rank.

    **Fix:** deploy one code package to every node and build the loss from one config on
    every rank (compare the loss hyperparameters and code hashes across ranks).
    """

    code = "SD701"
    name = "loss-definition-mismatch"
    category = "loss.definition_mismatch"
    stage = "forward"
    title = "Loss function differs across ranks"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        params = ev.differing("loss", "params") or ev.differing("loss", "type")
        if params:
            keys = sorted({k for v in params.values() if isinstance(v, dict) for k in v})
            changed = [k for k in keys if len({repr((params[r] or {}).get(k)) for r in params}) > 1] if keys else []
            detail = "; ".join(f"{k} " + describe_split({r: (params[r] or {}).get(k) for r in params}) for k in changed)
            if not detail:
                detail = "type " + describe_split(ev.snapshot_values("loss", "type"))
            return self.found(
                0.95,
                [f"loss settings differ at start (snapshot before step 1): {detail}"],
                ranks=majority_outliers({r: repr(v) for r, v in params.items()}),
                direct=True,
            )
        offsets = ev.loss.offsets
        if offsets is None:
            return None
        types = ev.snapshot_values("loss", "type")
        if len(types) > 1 and None not in types.values():
            # Every rank recorded the same loss module with the same settings: the offset
            # comes from the data. Without a recorded module (a loss computed inside the
            # model, a smoother outside it) the snapshots prove nothing about the loss.
            return None
        if ev.replicas.divergence is not None and ({"mode", "param", "counter"} & set(ev.replicas.divergence.what)):
            return None  # parted replicas or modes explain offsets better
        if ev.evaluations.parted:
            return None  # the final evaluations differ: a loss definition leaves the replicas equal
        odd = [
            r
            for r, t in offsets.t_stat.items()
            if abs(t) > OFFSET_T and abs(offsets.by_rank[r]) > OFFSET_MIN and offsets.same_sign[r] >= OFFSET_SAME_SIDE
        ]
        if not odd or len(odd) == len(offsets.by_rank) and len(odd) > 2:
            return None
        evidence = [
            "steady loss offsets against the same-step mean of all ranks: "
            + ", ".join(
                f"rank {r}: {offsets.by_rank[r]:+.1%} over steps {offsets.window[r][0]}–"
                f"{offsets.window[r][1]} (t={offsets.t_stat[r]:.0f}, "
                f"{offsets.same_sign[r]:.0%} of steps on that side)"
                for r in sorted(odd)
            ),
            f"same-step spread is {offsets.spread:.1%} of the loss; ranks on different data scatter "
            "around the mean instead",
        ]
        if ev.has_records and ev.replicas.divergence is None:
            evidence.append("replicas stayed identical: the difference is in how the loss is computed")
        return self.found(
            0.8 if ev.has_records else 0.65,
            evidence,
            ranks=sorted(odd),
            title=f"Loss computed differently on {fmt_ranks(odd)}",
        )

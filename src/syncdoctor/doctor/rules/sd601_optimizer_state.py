from __future__ import annotations

from typing import Any

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.must_equal import describe
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split


class OptimizerStateMismatch(Rule):
    """Identical gradients, different updates: the optimizer differs across ranks.

    **Symptom:** the loss curve looks normal but the model does not converge as
    well as on one card; replicas part although the reduced gradients agree
    (quick reference, last row: 对比各卡优化器state_dict).

    **Cause:** an optimizer hyperparameter (lr, momentum, weight decay, betas) or
    its state (momentum buffers, Adam moments, step count) differs on some rank —
    a per-rank config, a state reset or a checkpoint loaded on one rank only.

    From logs alone: a learning rate, weight decay or momentum that the ranks print
    differently at the same step (read from any `key=value`, `key: value`, JSON or dict
    line), or a value every rank printed alike step after step until one rank's
    parted (learned from the log, weaker).

    **Quick check:** compare `optimizer.state_dict()` hashes across ranks after a step.

    **Fix:** build the optimizer from the same config on every rank, never change a
    hyperparameter on one rank, and load its state on every rank (or broadcast it) after
    resuming.
    """

    code = "SD601"
    name = "optimizer-state-mismatch"
    category = "optim.state_mismatch"
    stage = "optimizer"
    title = "Optimizer state or hyperparameters differ across ranks"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence = []
        groups = ev.differing("optimizer", "param_groups")
        kinds = ev.differing("optimizer", "type")
        if kinds:
            evidence.append("optimizer type differs at start: " + describe_split(kinds))
        # A rank that froze other layers, or built its optimizer from another parameter list.
        counts = ev.differing("optimizer", "n_params")
        if counts:
            evidence.append("the optimizer updates different numbers of parameters: " + describe_split(counts))
        if groups:
            evidence.append(
                "optimizer hyperparameters differ at start (snapshot before step 1): "
                + "; ".join(hyperparameter_differences(groups))
            )
        div = ev.replicas.divergence
        # A schedule ticks per update: ranks out of step show other learning rates too.
        drift = ev.settings.hyperparameter_drift if not (div and "counter" in div.what) else None
        if drift is not None and not groups:
            evidence.append(
                f"the learning rate differs across ranks from step {drift[0]}: "
                f"lr {describe_split(drift[1])} (changed on some ranks only)"
            )
        elif div is not None and "config" in div.what and not groups:
            evidence.append(f"the optimizer/loss configuration differs across ranks at the check of step {div.step}")
        if not evidence and not ev.has_records:
            return self._from_logs(ev)
        first_step = int_of(ev.steps["step"].min()) if ev.has_records else None
        # Parted at the first check, the weights may have differed before any update
        # (an init mismatch) unless the fingerprints taken at the start agreed.
        initial = ev.replicas.initial_weights() if div is not None and div.step == first_step else None
        started_alike = initial is not None and not initial[0] and initial[1] == 1
        # "The gradients agree" only where they were measured after the parting.
        state_only = (
            div is not None
            and {"param", "opt"} & set(div.what)
            and not ({"grad", "counter", "mode", "buffer"} & set(div.what))
            and (div.step != first_step or started_alike)
            and ev.replicas.agree_after("grad", div.step) is True
            # The optimizer state measured after the parting and equal: the update read
            # the same inputs everywhere (the weights changed outside it: SD508).
            and ev.replicas.agree_after("opt", div.step) is not True
        )
        if state_only and div is not None:
            evidence.append(
                f"parameters and optimizer state part at step {div.step} while the reduced "
                "gradients and step counters stay identical"
                + (" (the weights agreed before the first update)" if started_alike else "")
            )
        if not evidence:
            return None
        if ev.numerics.overflow_disagreement:
            return None
        direct = bool(groups or kinds or counts or drift)
        differing = groups or kinds or counts or (drift[1] if drift else {})
        ranks = agreement({r: repr(v) for r, v in differing.items()}).odd if direct else []
        if div is not None and div.ranks and not ranks:
            ranks = div.ranks
        step = div.step if div else None
        if drift is not None and not groups and (step is None or drift[0] < step):
            step = drift[0]
        return self.found(
            0.95 if direct else 0.85,
            evidence,
            ranks=ranks,
            step=step,
            tensor=div.tensor if div else None,
            direct=direct,
        )

    def _from_logs(self, ev: Evidence) -> Finding | None:
        """The ranks' logs print an optimizer value that differs at the same step."""
        partings = ev.settings.log_partings
        p = partings.get("optim")
        learned = p is None
        if p is None:
            p = partings.get("learned")
        if p is None or ev.numerics.overflow_disagreement:
            return None
        counter = partings.get("counter")
        evidence = [
            (
                "the ranks print a different optimizer value: "
                if not learned
                else "a value every rank printed alike, step after step, parts: "
            )
            + describe(p, describe_split)
            + (f" ({p.where})" if p.where else "")
        ]
        confidence = 0.9 if not learned else 0.6
        if counter is not None and counter.step <= p.step:
            evidence.append(
                f"the update counters part first ({describe(counter, describe_split)}): a schedule follows them"
            )
            confidence -= 0.3
        return self.found(
            confidence,
            evidence,
            ranks=agreement({r: repr(v) for r, v in p.values.items()}).odd,
            step=p.step,
            severity="error" if not learned else "warning",
            direct=not learned,
        )


def hyperparameter_differences(groups: dict[int, Any]) -> list[str]:
    """`weight_decay 0.05 (rank 0) vs 0.0001 (rank 1)` for each hyperparameter of each
    param group that differs."""
    out = []
    n_groups = max((len(v) for v in groups.values() if isinstance(v, list)), default=0)
    for g in range(n_groups):
        per_rank = {
            r: (v[g] if isinstance(v, list) and g < len(v) and isinstance(v[g], dict) else {})
            for r, v in groups.items()
        }
        keys = sorted({k for d in per_rank.values() for k in d})
        prefix = f"group {g}: " if n_groups > 1 else ""
        for key in keys:
            values = {r: d.get(key) for r, d in per_rank.items()}
            if len({repr(v) for v in values.values()}) > 1:
                out.append(f"{prefix}{key} {describe_split(values)}")
    counts = {r: len(v) if isinstance(v, list) else 0 for r, v in groups.items()}
    if len(set(counts.values())) > 1:
        out.append(f"number of param groups {describe_split(counts)}")
    return out or ["param groups differ"]

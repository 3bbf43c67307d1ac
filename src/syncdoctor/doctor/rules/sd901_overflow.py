from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.must_equal import describe
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split
from syncdoctor.rulebook import fmt_ranks


class OverflowDisagreement(Rule):
    """Mixed precision: ranks disagree on overflow, or fp16 overflows constantly.

    **Symptom:** some ranks skip an update for inf/nan gradients while others
    apply it; replicas part from that step.

    **Cause:** the overflow check runs on local gradients before the reduction (or
    the found-inf flag is not all-reduced), so the skip decision is per rank; or
    fp16 is used without a loss scaler.

    From logs alone: the ranks print different loss scales at the same step (each
    scaler halved its scale on its own overflows).

    **Quick check:** log the overflow flag and loss scale on every rank each step.

    **Fix:** decide overflow from the reduced gradients or all-reduce the found-inf flag
    (GradScaler under DDP, `ms.amp.all_finite` + DynamicLossScaler on the reduced
    grads); use a dynamic loss scaler with fp16; load a resumed scaler's state
    (`scaler.load_state_dict`) on every rank, not under a rank-0 branch.
    """

    code = "SD901"
    name = "overflow-disagreement"
    category = "numeric.overflow"
    stage = "loss_scale"
    title = "Ranks disagree on gradient overflow"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        disagree = ev.numerics.overflow_disagreement
        if disagree:
            step, ranks = disagree[0]
            evidence = [
                f"at step {step} {fmt_ranks(ranks)} skipped the update for overflow and the others did not"
                f" ({len(disagree)} such steps)"
            ]
            div = ev.replicas.divergence
            if div and div.step >= step:
                evidence.append(f"replicas part at step {div.step}, after the first disagreement")
            return self.found(0.95, evidence, ranks=ranks, step=step)
        p = ev.settings.record_partings.get("scale")
        if p is not None:
            div = ev.replicas.divergence
            evidence = [
                "the ranks hold a different loss scale: "
                + describe(p, describe_split)
                + (
                    "; a scaler state loaded or set on some ranks only"
                    if not p.agreed_steps
                    else "; each scaler changed its scale on its own"
                )
                + ": the all-reduce averages gradients scaled differently and each rank unscales them by its own"
                " scale, so the update differs while the reduction itself is sound"
            ]
            if div and div.step >= p.step:
                evidence.append(f"replicas part at step {div.step}, at the first different scale or after")
            return self.found(
                0.9,
                evidence,
                ranks=agreement({r: repr(v) for r, v in p.values.items()}).odd,
                step=p.step,
                title="Ranks hold different loss scales: each unscales the averaged gradients by its own",
                direct=True,
            )
        p = ev.settings.log_partings.get("scale")
        if p is not None:
            return self.found(
                0.9,
                [
                    "the ranks print a different loss scale: "
                    + describe(p, describe_split)
                    + (f" ({p.where})" if p.where else "")
                    + "; the scale halves on each overflow, so the ranks skipped different steps"
                ],
                ranks=agreement({r: repr(v) for r, v in p.values.items()}).odd,
                step=p.step,
                direct=True,
            )
        steps = ev.steps.height if ev.has_records else 0
        if steps and ev.numerics.overflow_steps > 0.2 * steps / max(1, len(ev.ranks)):
            return self.found(
                0.5,
                [f"{ev.numerics.overflow_steps} overflow skips over {steps} rank-steps"],
                ranks=ev.ranks,
                severity="warning",
                title="Frequent fp16 overflow",
            )
        return None

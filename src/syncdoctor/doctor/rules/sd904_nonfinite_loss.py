from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class NonfiniteLoss(Rule):
    """The loss became NaN or infinite: which rank first, at which step.

    **Symptom:** the loss turns `nan` or `inf` — on one rank first, then (through the
    gradient average) on all of them; accuracy falls to chance and never comes back.

    **Cause:** an overflow in reduced precision (fp16 without loss scaling, a loss
    scale that stopped adapting), a log/division of zero on some batch, or a step
    size so large the weights blow up. When one rank goes non-finite before the
    others, its batch or its numerics started it and the all-reduce spread it.

    **Quick check:** look at the first non-finite step's batch on the first rank
    named, and at the loss scale and overflow flags around it.

    **Fix:** use dynamic loss scaling (torch.amp.GradScaler / MindSpore's
    DynamicLossScaler) or bf16, clip gradients, guard the loss against log(0) and empty
    masks, and skip the update when gradients are not finite.
    """

    code = "SD904"
    name = "nonfinite-loss"
    category = "numeric.overflow"
    stage = "forward"
    title = "Loss became NaN/inf"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        losses = ev.losses
        if not losses.height:
            return None
        bad = losses.filter(~pl.col("loss").is_finite())
        if not bad.height:
            return None
        first_step = int_of(bad["step"].min())
        first = sorted(int(r) for r in bad.filter(pl.col("step") == first_step)["rank"].unique())
        ranks_with_loss = sorted(int(r) for r in losses["rank"].unique())
        ranks_ever = sorted(int(r) for r in bad["rank"].unique())
        value = bad.filter(pl.col("step") == first_step)["loss"][0]
        what = "NaN" if value != value else ("+inf" if value > 0 else "-inf")
        evidence = [
            f"the loss is {what} on {fmt_ranks(first)} at step {first_step}, "
            f"{bad.height} non-finite values in all (on {fmt_ranks(ranks_ever)})"
        ]
        at_first = losses.filter(pl.col("step") == first_step)
        finite_peers = sorted(int(r) for r in at_first.filter(pl.col("loss").is_finite())["rank"])
        if finite_peers:
            evidence.append(
                f"{fmt_ranks(finite_peers)} still had a finite loss at that step: {fmt_ranks(first)} went first"
            )
            confidence = 0.85
        else:
            evidence.append(
                "every rank with a loss went non-finite at the same step: the numerics of "
                "the whole job (step size, precision), not one rank's"
            )
            confidence = 0.6
        if ev.numerics.overflow_steps:
            evidence.append(f"{ev.numerics.overflow_steps} steps were skipped for overflow by the loss scaler")
            confidence = max(confidence, 0.8)
        return self.found(
            confidence,
            evidence,
            ranks=first if len(first) < len(ranks_with_loss) else ranks_with_loss,
            step=first_step,
            title=f"Loss became {what} at step {first_step} on {fmt_ranks(first)}",
            severity="error" if finite_peers or ev.numerics.overflow_steps else "warning",
        )

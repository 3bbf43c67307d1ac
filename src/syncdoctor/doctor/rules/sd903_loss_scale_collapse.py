from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import loss_scale
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

# Dynamic loss scaling starts high (2^16 .. 2^32) and halves on each overflow until
# gradients fit: skips early in a run, ending at a comfortable scale, are its
# warm-up. A scale driven down to a handful (or below one), a scaler at its floor,
# or most steps skipped mean every step overflows: fp16 cannot hold the gradients.
LOW_SCALE = 16.0
MIN_STEPS_FOR_RATIO = 20
SKIPPED_FRACTION = 0.5


class LossScaleCollapse(Rule):
    """Mixed precision: the loss scale collapses, every step overflows.

    **Symptom:** the log fills with "OVERFLOW! Rank 0 Skipping step" / "Gradient
    overflow. Skipping step, loss scaler 0 reducing loss scale to …" down to a
    scale of a few units or below one, DeepSpeed's "step=2000, skipped=1995", or
    "Current loss scale already at minimum - cannot decrease scale anymore";
    the printed loss may read 0.0. (A few skips at the start while the scale comes
    down from 2^16 or more are normal warm-up, and are left alone.)

    **Cause:** the gradients overflow fp16 at every step: a model pre-trained in
    bf16 fine-tuned in fp16, a too-high learning rate, an unstable layer. Not a
    synchronisation fault: every rank skips together because the overflow flag is
    all-reduced.

    **Quick check:** print the loss scale and the gradient norm per step; try bf16
    or fp32 for a few hundred steps.

    **Fix:** train in bf16 (or fp32) when the model was pre-trained in bf16; otherwise
    lower the learning rate, add warm-up and gradient clipping.
    """

    code = "SD903"
    name = "loss-scale-collapse"
    category = "numeric.overflow"
    stage = "loss_scale"
    title = "The fp16 loss scale collapsed: every step overflows"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        scales: list[float] = []
        at_minimum = None
        worst_ratio: tuple[float, int, int] | None = None
        first_line = None
        for event in ev.events.of("overflow"):
            step = loss_scale(event.raw)
            if step is None:
                continue
            first_line = first_line or event
            if step.at_minimum:
                at_minimum = event
            if step.scale is not None:
                scales.append(step.scale)
            if step.skip_counter is not None:
                n, skipped = step.skip_counter
                if n >= MIN_STEPS_FOR_RATIO and (worst_ratio is None or skipped / n > worst_ratio[0]):
                    worst_ratio = (skipped / n, n, skipped)
        evidence: list[str] = []
        if at_minimum is not None:
            evidence.append(
                f"the loss scaler reached its floor: {at_minimum.source}:{at_minimum.line}: {at_minimum.raw[:160]}"
            )
        if worst_ratio is not None and worst_ratio[0] > SKIPPED_FRACTION:
            evidence.append(f"{worst_ratio[2]} of {worst_ratio[1]} steps skipped for overflow")
        falling = self._falling_run(scales)
        if scales and min(scales) <= LOW_SCALE and falling >= 3:
            evidence.append(f"the loss scale fell {falling} times in a row to {min(scales):g}: every step overflows")
        below = self._below_one(ev)
        if below is not None:
            evidence.append(below[0])
        if not evidence:
            return None
        at = first_line.step if first_line else (below[1] if below else None)
        return self.found(0.9, evidence, step=at)

    @staticmethod
    def _below_one(ev: Evidence) -> tuple[str, int | None] | None:
        """A loss (or gradient) scale printed below one, under any key and in any
        line (ingest/values.py): a dynamic scaler starts at 2^16 and halves per
        overflow, so below one it has halved at every step for many steps."""
        values = getattr(ev.logs, "values", None)
        if values is None or not values.height:
            return None
        low = values.filter(
            pl.col("key").str.contains(r"(?:loss|grad)_?scale")
            & pl.col("value").is_finite()
            & (pl.col("value") < 1)
            & (pl.col("value") >= 0)
        )
        if not low.height:
            return None
        row = low.sort("value").row(0, named=True)
        ranks = sorted({int(r) for r in low["rank"].drop_nulls().to_list()})
        who = f" on {fmt_ranks(ranks)}" if ranks else ""
        return (
            f"the loss scale is printed below one{who}: `{row['key']}` = {row['value']:.3g} "
            f"({row['source']}:{row['line']}); it halves once per overflow from 2^16, so every step overflowed",
            row["step"],
        )

    @staticmethod
    def _falling_run(scales: list[float]) -> int:
        """The longest run of consecutive reductions of the scale."""
        best = run = 0
        for a, b in zip(scales, scales[1:], strict=False):
            run = run + 1 if b < a else 0
            best = max(best, run)
        return best + (1 if best else 0)

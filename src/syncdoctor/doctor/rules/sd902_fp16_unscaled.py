from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence, float_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class Fp16WithoutLossScaling(Rule):
    """Gradients in float16 with no loss scaling.

    **Symptom:** training stalls or gets noisy under mixed precision; gradients
    that are small underflow to zero and large ones overflow to inf.

    **Cause:** fp16 training or fp16 gradient reduction without a loss scaler, so
    the gradients live in fp16's narrow range (6e-8 … 65504).

    **Quick check:** log the loss scale and the overflow flag; train once in FP32
    and compare.

    **Fix:** use a dynamic loss scaler (`torch.amp.GradScaler`,
    `DynamicLossScaleManager` / `ms.amp.DynamicLossScaler`), or keep the reduction in
    fp32.
    """

    code = "SD902"
    name = "fp16-without-loss-scaling"
    category = "numeric.overflow"
    stage = "loss_scale"
    severity = "warning"
    title = "float16 gradients without loss scaling"

    def evaluate(self, ev: Evidence) -> Finding | None:
        if not ev.has_records or ev.numerics.overflow_disagreement:
            return None
        evidence = []
        declared = {r for r, v in ev.snapshot_values("ddp", "grad_dtype").items() if v in ("float16", "fp16")}
        if declared:
            evidence.append(f"the gradients are float16 on ranks {sorted(declared)} (snapshot)")
        steps = ev.steps
        if "grad_fp16" in steps.columns:
            checked = steps.filter(pl.col("grad_fp16").is_not_null())
            if checked.height and float_of(checked["grad_fp16"].mean()) > 0.5:
                evidence.append(
                    f"the gradients hold only float16 values at {float_of(checked['grad_fp16'].mean()):.0%} "
                    f"of {checked.height} checked rank-steps"
                )
        if not evidence:
            return None
        scales = steps["loss_scale"].drop_nulls()
        managers = [v for v in ev.snapshot_values("ddp", "loss_scale_manager").values() if v]
        if (scales.len() and float_of(scales.max()) > 1.0) or managers:
            return None
        evidence.append("no loss scale above 1 was ever in use")
        return self.found(0.7, evidence, ranks=ev.ranks)

from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import CallInfo, ScriptContext, dotted_name, literal


class Fp16WithoutLossScale(Check):
    """Training in float16 without loss scaling.

    **Symptom:** small gradients underflow to zero and large ones overflow, to a
    different degree on each rank: the loss stalls or jumps.

    **Cause:** `autocast` with float16 (the CUDA default), `model.half()`, or
    MindSpore `auto_mixed_precision(net, "O2"/"O3")` / `amp_level="O3"`, with no
    GradScaler or loss-scale manager.

    **Fix:** PyTorch: `torch.amp.GradScaler`; MindSpore: a `DynamicLossScaleManager`
    (Model) or `DynamicLossScaler` / `TrainOneStepWithLossScaleCell`; or use bfloat16.
    """

    code = "PF310"
    name = "fp16-without-loss-scale"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if "loss_scale" in ctx.project_facts:
            return
        trains = bool({"backward", "custom_loop", "ms_model"} & ctx.facts) or any(
            c.name.startswith("TrainOneStep") for c in ctx.calls
        )
        if not trains:
            return
        for c in ctx.calls:
            what = _fp16(ctx, c)
            if what:
                yield Hit.at(
                    c.node,
                    f"{what} without loss scaling: float16 gradients underflow; add a loss scaler (or use bfloat16)",
                )
                return


def _is_fp16(expr: ast.AST | None) -> bool:
    text = (dotted_name(expr) or str(literal(expr))).lower() if expr is not None else ""
    return text.endswith(("float16", "half")) and "bfloat" not in text


def _modelish(c: CallInfo) -> bool:
    name = (dotted_name(c.receiver) or "").lower() if c.receiver is not None else ""
    return "model" in name or "net" in name


def _fp16(ctx: ScriptContext, c: CallInfo) -> str | None:
    if c.name == "autocast" and c.under("torch"):
        dtype = c.kw("dtype")
        if dtype is not None:
            return "autocast(float16)" if _is_fp16(dtype.value) else None
        if c.under("torch.cuda.amp"):
            return "torch.cuda.amp.autocast()"
        device = literal(c.arg(0, "device_type"))
        return f"autocast({device!r})" if device in ("cuda", "npu") else None
    if c.name == "half" and _modelish(c):
        return f"{dotted_name(c.receiver)}.half()"
    if c.name in ("to", "to_float") and _modelish(c) and _is_fp16(c.arg(0, "dtype")):
        return f"{dotted_name(c.receiver)}.{c.name}(float16)"
    if c.name == "auto_mixed_precision" and literal(c.arg(1, "amp_level")) in ("O2", "O3"):
        return f"auto_mixed_precision(level={literal(c.arg(1, 'amp_level'))!r})"
    amp = c.kw("amp_level") or c.kw("level")
    if c.name in ("Model", "build_train_network") and amp and literal(amp.value) == "O3":
        return f"{c.name}(amp_level='O3')"
    return None

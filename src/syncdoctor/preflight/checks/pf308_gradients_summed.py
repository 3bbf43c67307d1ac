from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import CallInfo, ScriptContext, dotted_name, literal


class GradientsSummed(Check):
    """Gradients are summed across ranks instead of averaged.

    **Symptom:** the effective learning rate is multiplied by the number of cards:
    loss jumps or diverges on many cards only.

    **Cause:** MindSpore's `set_auto_parallel_context(parallel_mode=...)` without
    `gradients_mean=True` (its default is False: a sum), `DistributedGradReducer(...,
    mean=False)`, or a hand-written `dist.all_reduce(p.grad)` (SUM by default) that is
    never divided by the world size.

    **Fix:** `set_auto_parallel_context(..., gradients_mean=True)`; in PyTorch divide
    the reduced gradient by the world size or use `op=ReduceOp.AVG`.
    """

    code = "PF308"
    name = "gradients-summed"
    severity = "error"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        for c in ctx.calls:
            if c.name == "set_auto_parallel_context" and not c.has_kwargs_splat():
                mean, mode = c.kw("gradients_mean"), c.kw("parallel_mode")
                if mean is not None and literal(mean.value) is False:
                    yield Hit.at(
                        c.node, "gradients_mean=False: gradients are summed over the cards; set gradients_mean=True"
                    )
                elif (
                    mean is None
                    and mode is not None
                    and not _stand_alone(mode.value)
                    and "gradients_mean" not in ctx.project_facts
                ):
                    yield Hit.at(
                        c.node,
                        "parallel_mode is set without gradients_mean=True: "
                        "MindSpore sums the gradients over the cards by default",
                    )
            elif c.name == "DistributedGradReducer" and literal(c.arg(1, "mean")) is False:
                yield Hit.at(
                    c.node, "DistributedGradReducer(mean=False) sums the gradients over the cards; pass mean=True"
                )
            elif c.name == "all_reduce" and _sums_grad(ctx, c):
                yield Hit.at(
                    c.node,
                    "all_reduce of a gradient with the default SUM and no "
                    "division by the world size; divide, or use ReduceOp.AVG",
                )


def _stand_alone(value: ast.expr) -> bool:
    text = (dotted_name(value) or str(literal(value))).lower()
    return "stand_alone" in text or "standalone" in text


def _sums_grad(ctx: ScriptContext, c: CallInfo) -> bool:
    tensor = c.arg(0, "tensor")
    if tensor is None or ".grad" not in f".{dotted_name(tensor) or ''}.":
        return False
    op = c.arg(1, "op")
    if op is not None and "SUM" not in (dotted_name(op) or "").upper():
        return False
    scope = c.loops[-1] if c.loops else c.func or ctx.tree
    return not any(_divides(n) for n in ast.walk(scope))


def _divides(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp | ast.AugAssign):
        return isinstance(node.op, ast.Div)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("div_", "div", "true_divide", "mul_", "divide")
    )

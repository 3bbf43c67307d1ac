from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, is_optimizer_ctor, literal


class LrNotScaled(Check):
    """A data-parallel script uses a hard-coded learning rate that does not depend on
    the world size.

    **Symptom:** all ranks agree, but the loss decreases more slowly (or less stably)
    than the single-card run it was tuned on (quick-ref row 4).

    **Cause:** the global batch is batch_size × world_size, but the learning rate is
    a constant tuned for one card.

    **Fix:** scale it with the global batch (linear rule: lr × world_size, with
    warm-up), or take it from a configuration written for the global batch.
    """

    code = "PF315"
    name = "lr-not-scaled"
    severity = "info"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if not ctx.data_parallel:
            return
        for c in ctx.calls:
            if not is_optimizer_ctor(c):
                continue
            named = c.kw("learning_rate")
            lr = named.value if named is not None else c.arg(1, "lr")
            if lr is None or ctx.world_dependent(lr):
                continue
            values = ctx.bound_values(lr)
            if values and all(_constant(v) for v in values):
                yield Hit.at(
                    lr,
                    f"learning rate {ast.unparse(values[0])} is a constant that "
                    "ignores the world size; scale it with the global batch",
                )
                return


def _constant(expr: ast.AST) -> bool:
    if isinstance(expr, ast.BinOp):
        return _constant(expr.left) and _constant(expr.right)
    value = literal(expr)
    return isinstance(value, int | float) and not isinstance(value, bool)

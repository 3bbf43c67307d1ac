from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, is_loss_ctor, is_optimizer_ctor

HPARAM_KEYS = frozenset(
    {
        "lr",
        "learning_rate",
        "momentum",
        "weight_decay",
        "betas",
        "eps",
        "dampening",
        "nesterov",
        "margin",
        "gamma",
        "alpha",
        "beta",
    }
)


class RankDependentHyperparameter(Check):
    """A loss or optimizer hyperparameter depends on the rank.

    **Symptom:** ranks average gradients of different losses or apply different
    updates: it looks like a communication fault, with per-rank loss offsets and
    replicas that drift apart.

    **Cause:** a value computed from `rank` / `get_rank()` / `os.environ["RANK"]`
    (directly or assigned under `if rank ...`) passed to a loss or optimizer, or
    written into `optimizer.param_groups`.

    **Fix:** every rank must build the same loss and optimizer; take hyperparameters
    from the shared configuration, never from the rank.
    """

    code = "PF314"
    name = "rank-dependent-hyperparameter"
    severity = "error"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        for c in ctx.calls:
            if not (is_optimizer_ctor(c) or is_loss_ctor(c)):
                continue
            kind = "optimizer" if is_optimizer_ctor(c) else "loss"
            params: list[tuple[str | None, ast.expr]] = [
                (None, a) for a in c.node.args[1 if kind == "optimizer" else 0 :]
            ]
            params += [
                (k.arg, k.value)
                for k in c.node.keywords
                if k.arg and "device" not in k.arg and k.arg not in ("params", "rank")
            ]
            for name, value in params:
                if ctx.rank_dependent(value):
                    label = f"{name}=" if name else "argument "
                    yield Hit.at(
                        value,
                        f"{kind} {c.name}: {label}{_short(ast.unparse(value))} "
                        "depends on the rank; every rank must use the same value",
                    )
        for a in ctx.assigns:
            t = a.target
            if (
                isinstance(t, ast.Subscript)
                and isinstance(t.slice, ast.Constant)
                and t.slice.value in HPARAM_KEYS
                and ctx.rank_dependent(a.value)
            ):
                yield Hit.at(
                    t, f"{ast.unparse(t)} is set from a rank-dependent value; every rank must use the same value"
                )


def _short(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."

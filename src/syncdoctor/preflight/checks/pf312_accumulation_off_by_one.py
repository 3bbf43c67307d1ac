from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import (
    ScriptContext,
    accumulation_guard,
    is_optimizer_step,
    literal,
)


class AccumulationOffByOne(Check):
    """The accumulation condition tests a 0-based counter: `if i % N == 0`.

    **Symptom:** the first update comes after one micro-batch, later ones after N,
    and the last cycle of an epoch is cut short; with uneven data on one rank the
    counters drift and the ranks update at different steps.

    **Cause:** `enumerate()` / `range()` count from 0, so `i % N == 0` is true at
    i = 0, N, 2N, ... i.e. before the cycle is complete.

    **Fix:** `if (i + 1) % N == 0:` (or `enumerate(loader, start=1)`).
    """

    code = "PF312"
    name = "accumulation-off-by-one"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        seen: set[int] = set()
        for c in ctx.calls:
            if not is_optimizer_step(ctx, c):
                continue
            guard = accumulation_guard(ctx, c)
            if guard is None or id(guard) in seen:
                continue
            seen.add(id(guard))
            counter = _zero_mod_test(guard.test)
            if counter and counter in _zero_based_counters(c.loops):
                yield Hit.at(
                    guard.test,
                    f"'{counter} % N == 0' is true at {counter} = 0: the "
                    f"first update follows one micro-step; use ({counter} + 1) % N == 0",
                )


def _zero_mod_test(test: ast.expr) -> str | None:
    """The counter name in `name % N == 0` (possibly inside an `and`)."""
    for node in ast.walk(test):
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq)
            and literal(node.comparators[0]) == 0
            and isinstance(node.left, ast.BinOp)
            and isinstance(node.left.op, ast.Mod)
            and isinstance(node.left.left, ast.Name)
        ):
            return node.left.left.id
    return None


def _zero_based_counters(loops: tuple[ast.AST, ...]) -> set[str]:
    names: set[str] = set()
    for loop in loops:
        if not isinstance(loop, ast.For) or not isinstance(loop.iter, ast.Call):
            continue
        fn = getattr(loop.iter.func, "id", None)
        args, kws = loop.iter.args, {k.arg for k in loop.iter.keywords}
        if fn == "enumerate" and len(args) == 1 and "start" not in kws:
            target = loop.target
            if isinstance(target, ast.Tuple) and target.elts and isinstance(target.elts[0], ast.Name):
                names.add(target.elts[0].id)
        elif (
            fn == "range"
            and isinstance(loop.target, ast.Name)
            and (len(args) == 1 or (len(args) >= 2 and literal(args[0]) == 0))
        ):
            names.add(loop.target.id)
    return names

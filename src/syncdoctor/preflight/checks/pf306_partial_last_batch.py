from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import CallInfo, ScriptContext, is_shard_point, literal


class PartialLastBatch(Check):
    """A data-parallel loader keeps the last, partial batch.

    **Symptom:** ranks end an epoch with batches of different sizes (or different
    step counts), so gradients have different weight; with gradient accumulation the
    ranks' update points drift apart.

    **Cause:** `DataLoader(..., sampler=DistributedSampler(...))` without
    `drop_last=True`, or a sharded MindSpore dataset batched without
    `drop_remainder=True`.

    **Fix:** pass `drop_last=True` / `drop_remainder=True` to the training loader.
    """

    code = "PF306"
    name = "partial-last-batch"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if not ctx.data_parallel:
            return
        for c in ctx.calls:
            if c.has_kwargs_splat():
                continue
            if c.name == "DataLoader" and (c.qual is None or c.under("torch")):
                if _distributed_sampler(ctx, c) and _off(c, "drop_last"):
                    yield Hit.at(
                        c.node, "DataLoader with a DistributedSampler keeps the partial last batch: pass drop_last=True"
                    )
            elif (
                c.name == "batch"
                and "mindspore" in ctx.frameworks
                and c.qual is None
                and (c.node.args or c.kw("batch_size") is not None)
                and _off(c, "drop_remainder")
                and any(is_shard_point(s) for s in ctx.chain(c.receiver, c.node.lineno))
            ):
                yield Hit.at(
                    c.node, "sharded dataset is batched without drop_remainder=True: ranks get a partial last batch"
                )


def _off(c: CallInfo, name: str) -> bool:
    """The flag is absent or literally False (an expression is given the benefit of doubt)."""
    kw = c.kw(name)
    return kw is None or literal(kw.value) is False


def _distributed_sampler(ctx: ScriptContext, loader: CallInfo) -> bool:
    sampler = loader.kw("sampler")
    for value in ctx.bound_values(sampler.value if sampler else None):
        if isinstance(value, ast.Call):
            name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
            if name.endswith("DistributedSampler"):
                return True
    return False

from __future__ import annotations

import ast
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import CallInfo, ScriptContext, is_optimizer_step

BARRIERS = ("barrier", "monitored_barrier")


class SyncUnderRankBranch(Check):
    """An optimizer step, a backward pass under DDP, or a collective runs only on
    some ranks: it sits in an `if` that tests the rank.

    **Symptom:** for a step: replicas part from that step on without any error; for
    a collective: the other ranks wait until the timeout, or pair it with their next
    collective and exchange the wrong tensors.

    **Cause:** `if rank == 0: optimizer.step()`, `if dist.get_rank() == 0:
    dist.all_reduce(...)`, rank-0-only evaluation that calls a collective.

    **Fix:** run steps and collectives on every rank; keep only logging and saving
    under the rank test (`if rank == 0: torch.save(...)`).
    """

    code = "PF313"
    name = "sync-under-rank-branch"
    severity = "error"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        for c in ctx.calls:
            what = _sync_kind(ctx, c)
            if what is None:
                continue
            branch = ctx.rank_branch(c)
            if branch is None or _mirrored(ctx, c, branch) or _paired_barrier(ctx, c):
                continue
            test = ast.unparse(branch[0].test)
            arm = "" if branch[1] == "body" else "the else of "
            yield Hit.at(
                c.node,
                f"{what} runs only under {arm}'if {_short(test)}' (line {branch[0].lineno}): not every rank takes it",
            )


def _sync_kind(ctx: ScriptContext, c: CallInfo) -> str | None:
    if ctx.is_collective(c):
        return f"collective {c.name}()"
    if is_optimizer_step(ctx, c):
        return f"{ast.unparse(c.node.func)}()"
    if c.name == "backward" and "ddp" in ctx.facts:
        return "backward() under DDP (it all-reduces)"
    return None


def _mirrored(ctx: ScriptContext, c: CallInfo, branch: tuple[ast.If, str]) -> bool:
    """The other arm of the same `if` makes the same call: every rank takes one."""
    other = (branch[0], "orelse" if branch[1] == "body" else "body")
    return any(o.name == c.name and other in o.branches for o in ctx.calls)


def _paired_barrier(ctx: ScriptContext, c: CallInfo) -> bool:
    """`if rank != 0: barrier()` ... `if rank == 0: barrier()`: the usual "rank 0
    first" idiom, where the two rank-guarded barriers meet each other."""
    if c.name not in BARRIERS:
        return False
    guarded = [o for o in ctx.calls if o.name in BARRIERS and o.func is c.func and ctx.rank_branch(o) is not None]
    return len(guarded) >= 2


def _short(text: str) -> str:
    return text if len(text) <= 50 else text[:47] + "..."

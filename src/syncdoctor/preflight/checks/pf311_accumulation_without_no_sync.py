from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, accumulation_guard, is_optimizer_step


class AccumulationWithoutNoSync(Check):
    """Gradient accumulation under DDP without `no_sync()`.

    **Symptom:** none in the loss: every micro-step all-reduces gradients that are
    not used yet, so accumulation costs N times the communication.

    **Cause:** DDP reduces in every `backward()` unless the micro-steps that do not
    end a cycle run inside `model.no_sync()`.

    **Fix:** `with model.no_sync(): loss.backward()` for all but the last micro-step
    of each cycle (or accelerate's `accumulate`).
    """

    code = "PF311"
    name = "accumulation-without-no-sync"
    severity = "info"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if "ddp" not in ctx.facts or "no_sync" in ctx.project_facts:
            return
        for c in ctx.calls:
            if is_optimizer_step(ctx, c) and accumulation_guard(ctx, c) is not None:
                yield Hit.at(c.node, "gradient accumulation under DDP without no_sync(): every micro-step all-reduces")
                return

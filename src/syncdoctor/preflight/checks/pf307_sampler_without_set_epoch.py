from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, literal


class SamplerWithoutSetEpoch(Check):
    """A shuffling DistributedSampler is used but `set_epoch` is never called.

    **Symptom:** every epoch reads the same order on every rank; the loss curve
    repeats its pattern epoch after epoch and generalisation suffers.

    **Cause:** DistributedSampler derives its permutation from seed + epoch, and the
    epoch only changes through `sampler.set_epoch(epoch)`.

    **Fix:** call `sampler.set_epoch(epoch)` at the start of every epoch, before
    iterating the loader.
    """

    code = "PF307"
    name = "sampler-without-set-epoch"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if "set_epoch" in ctx.project_facts:
            return
        for c in ctx.calls:
            shuffle = c.arg(3, "shuffle")
            if c.name.endswith("DistributedSampler") and (shuffle is None or literal(shuffle) is not False):
                yield Hit.at(
                    c.node,
                    "DistributedSampler shuffles but set_epoch() is never called: every epoch repeats the same order",
                )

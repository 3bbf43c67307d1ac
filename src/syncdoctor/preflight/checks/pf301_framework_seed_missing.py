from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext

_SEEDS = {"torch": ("seed:torch", "torch.manual_seed(seed)"), "mindspore": ("seed:mindspore", "ms.set_seed(seed)")}


class FrameworkSeedMissing(Check):
    """A data-parallel script builds a model but never seeds the framework's RNG.

    **Symptom:** replicas start from different weights (MindSpore does not broadcast
    them; a hand-written all-reduce in PyTorch neither): ranks never agree and the
    loss is noisier than on one card.

    **Cause:** no `ms.set_seed` / `torch.manual_seed` (or a `set_seed`-style helper)
    anywhere in the files checked.

    **Fix:** call `ms.set_seed(seed)` or `torch.manual_seed(seed)` with the same seed
    on every rank before the model is built.
    """

    code = "PF301"
    name = "framework-seed-missing"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        anchor = ctx.dp_anchor
        if anchor is None or "model" not in ctx.facts:
            return
        for framework in sorted(ctx.frameworks):
            fact, call = _SEEDS[framework]
            if not {fact, "seed:all"} & ctx.project_facts:
                yield Hit.at(
                    anchor.node,
                    f"data-parallel {framework} script never seeds the "
                    f"framework RNG: call {call} with the same seed on every rank",
                )

from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, dotted_name, literal


class TrainModeNotSet(Check):
    """The network is trained without being put in training mode.

    **Symptom:** dropout is off and BatchNorm uses frozen statistics on the ranks
    concerned: one rank's loss is persistently lower or higher.

    **Cause:** a MindSpore Cell starts in inference mode and a hand-written training
    loop (value_and_grad / TrainOneStepCell) never calls `net.set_train()`; in
    PyTorch, `model.eval()` for validation with no `model.train()` afterwards.

    **Fix:** call `net.set_train()` (MindSpore) or `model.train()` (PyTorch) before
    each training phase.
    """

    code = "PF309"
    name = "train-mode-not-set"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        facts = ctx.project_facts
        if "mindspore" in ctx.frameworks and not {"set_train", "ms_model"} & facts:
            for c in ctx.calls:
                if (c.name in ("value_and_grad", "GradOperation") and c.under("mindspore")) or c.name.startswith(
                    "TrainOneStep"
                ):
                    yield Hit.at(
                        c.node,
                        "hand-written MindSpore training loop but set_train() is "
                        "never called: the network stays in inference mode",
                    )
                    return
        if "torch" in ctx.frameworks and "backward" in ctx.facts:
            trained = {
                _root(c)
                for c in ctx.calls
                if c.name == "train" and (not c.node.args or literal(c.node.args[0]) is not False)
            }
            for c in ctx.calls:
                if (
                    c.name == "eval"
                    and not c.node.args
                    and c.qual is None
                    and _root(c) not in trained
                    and _root(c) is not None
                ):
                    yield Hit.at(
                        c.node,
                        f"{_root(c)}.eval() is never undone by .train(): training that follows runs in inference mode",
                    )


def _root(c: object) -> str | None:
    receiver = getattr(c, "receiver", None)
    name = dotted_name(receiver) if receiver is not None else None
    return name.split(".")[0] if name else None

"""modes: at the first grad-enabled forward rank 0's train/eval flags of every module are
taken and re-applied at every grad-enabled forward."""

from __future__ import annotations

from typing import Any

from syncdoctor.experiment.inrank.agree import agree, late, rank_world
from syncdoctor.experiment.inrank.run import RUN


def first_forward(module: Any) -> None:
    """Global forward pre-hook until the first grad-enabled forward of a module with
    trainable parameters (the outermost one: its pre-hook runs before its children's)."""
    import torch

    if not torch.is_grad_enabled() or not any(p.requires_grad for p in module.parameters()):
        return
    handle = RUN.take("modes_hook")
    if handle is None:
        return
    handle.remove()
    assert RUN.status is not None
    modules = list(module.modules())
    flags = "".join("1" if m.training else "0" for m in modules)
    everyone = agree("modes", flags)
    if everyone is None:
        RUN.status.fail(
            "no process group at the first training forward"
            if rank_world() is None
            else late("the first training forward")
        )
        return
    wanted = everyone[0]
    if len(wanted) != len(modules):
        RUN.status.fail(
            f"{type(module).__name__} has {len(modules)} modules here and {len(wanted)} on rank 0: modes left as they are"
        )
        return
    target = [c == "1" for c in wanted]
    differed = sum(m.training != t for m, t in zip(modules, target, strict=True))

    def reapply(called: Any, _args: Any) -> None:
        if called is module and torch.is_grad_enabled():
            for m, t in zip(modules, target, strict=True):
                if m.training != t:
                    m.training = t

    reapply(module, ())
    # A global hook, not one on the module: a copy or a pickle of the user's module
    # must not carry this closure along (probe/torch/hooks.py).
    from torch.nn.modules.module import register_module_forward_pre_hook

    register_module_forward_pre_hook(reapply)
    RUN.status.changed = differed
    RUN.status.ok(
        f"rank 0's train/eval flags of {len(modules)} modules of {type(module).__name__} "
        f"({wanted.count('1')} in train mode) re-applied at every training forward"
    )

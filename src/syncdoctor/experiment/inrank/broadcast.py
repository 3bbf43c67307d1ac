"""broadcast: rank 0's parameters and floating buffers broadcast over the job's default group
where the probe takes the model (DDP construction, attach, the first backward or step)."""

from __future__ import annotations

import json
import weakref
import zlib
from typing import Any

from syncdoctor.experiment.inrank.agree import agree, late, rank_world
from syncdoctor.experiment.inrank.run import RUN, safe, variant


def before_ddp(module: Any) -> None:
    """DistributedDataParallel is being built on `module` (every rank is there)."""
    if variant() == "broadcast":
        safe(_broadcast, module, "DDP construction")


def before_watch(module: Any) -> None:
    """The probe takes `module` (attach, DDP, or the first backward/step of a loop
    without DDP): every rank is there, and the initial weights are fingerprinted next."""
    if variant() == "broadcast":
        safe(_broadcast, module, "the probe's attach")


def _sharded(tensors: list[Any], module: Any) -> bool:
    if any(hasattr(m, "_get_fsdp_state") or type(m).__name__ == "FullyShardedDataParallel" for m in module.modules()):
        return True
    return any(type(t).__name__ == "DTensor" for t in tensors)


def _broadcast(module: Any, where: str) -> None:
    import torch
    import torch.distributed as dist

    assert RUN.status is not None
    done = RUN.broadcast_done
    if done is None:
        done = RUN.broadcast_done = weakref.WeakSet()
    inner = getattr(module, "module", module)
    if module in done or inner in done:
        return
    done.add(module)
    params = list(module.parameters())
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    tensors = params + buffers
    shapes = [(tuple(t.shape), str(t.dtype)) for t in tensors]
    signature = json.dumps({"sharded": _sharded(tensors, module), "shapes": zlib.crc32(repr(shapes).encode())})
    everyone = agree("broadcast", signature)
    if everyone is None:
        RUN.status.fail("no process group when the model was taken" if rank_world() is None else late(where))
        return
    if any(json.loads(s)["sharded"] for s in everyone):
        RUN.status.fail(
            "the parameters are sharded (FSDP or DTensor): each rank holds other values by design, "
            "there is no full replica to broadcast"
        )
        return
    if len(set(everyone)) > 1:
        RUN.status.fail(f"the model taken at {where} has other parameter shapes on some ranks: nothing was broadcast")
        return
    if len(everyone) < 2:
        RUN.status.fail("one rank: there is nothing to broadcast to")
        return
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.detach(), src=0)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    RUN.status.ok(
        f"rank 0's {len(params)} parameters and {len(buffers)} buffers of {type(module).__name__} "
        f"({nbytes:,} bytes) broadcast at {where}"
    )

"""data and single: a map-style DataLoader's sampler becomes a DistributedSampler over one
global order (seed 0, drop_last, its epoch advanced at each pass); in the one-rank rerun a
DataLoader's batch is multiplied by the compared run's world size and every step runs at
that run's learning rate."""

from __future__ import annotations

import functools
import inspect
import os
import weakref
from typing import Any

from syncdoctor import settings
from syncdoctor.experiment.inrank.agree import rank_world
from syncdoctor.experiment.inrank.run import RUN, VARIANT_MARK, is_helper, safe


def patch_loader() -> None:
    from torch.utils.data import DataLoader

    original = DataLoader.__init__
    if getattr(original, VARIANT_MARK, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not is_helper():
            rewritten = safe(_rewrite_loader, signature, self, args, kwargs)
            if rewritten is not None:
                args, kwargs = rewritten
        original(self, *args, **kwargs)

    __init__._syncdoctor_variant = True  # type: ignore[attr-defined]
    DataLoader.__init__ = __init__  # type: ignore[method-assign]  # patched on purpose


def _world_here() -> tuple[int, int] | None:
    where = rank_world()
    if where is not None:
        return where
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return None


def _rewrite_loader(signature: inspect.Signature, loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    assert RUN.status is not None
    bound = signature.bind(loader, *args, **kwargs)
    arguments = bound.arguments
    RUN.loaders += 1
    label = f"DataLoader #{RUN.loaders} ({type(arguments['dataset']).__name__})"
    change = _shard_loader if RUN.status.name == "data" else _scale_batch
    if not change(label, arguments):
        return None
    (RUN.sharded if RUN.status.name == "data" else RUN.scaled).append(weakref.ref(loader))
    return bound.args[1:], bound.kwargs


def _shard_loader(label: str, arguments: dict[str, Any]) -> bool:
    from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

    assert RUN.status is not None
    dataset = arguments["dataset"]
    if isinstance(dataset, IterableDataset):
        RUN.status.fail(f"{label}: an IterableDataset decides its own order and split; there is no sampler to replace")
        return False
    if arguments.get("batch_sampler") is not None:
        RUN.status.fail(
            f"{label}: a custom batch_sampler ({type(arguments['batch_sampler']).__name__}) picks the batches; left as it is"
        )
        return False
    where = _world_here()
    if where is None:
        RUN.status.fail(f"{label}: built before the process group, and no RANK/WORLD_SIZE in the environment")
        return False
    rank, world = where
    sampler = arguments.get("sampler")
    if sampler is None:
        shuffle = bool(arguments.get("shuffle"))
        was = f"shuffle={shuffle}"
    elif isinstance(sampler, RandomSampler):
        shuffle, was = True, "RandomSampler"
    elif isinstance(sampler, SequentialSampler):
        shuffle, was = False, "SequentialSampler"
    elif isinstance(getattr(sampler, "shuffle", None), bool):
        shuffle, was = sampler.shuffle, type(sampler).__name__
    else:
        shuffle, was = True, f"{type(sampler).__name__} (taken as shuffling)"
    arguments["sampler"] = _global_order_sampler()(
        dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=0, drop_last=True
    )
    arguments["shuffle"] = None
    assert isinstance(arguments["sampler"], DistributedSampler)
    RUN.status.ok(
        f"{label}: {was} replaced by DistributedSampler({world} replicas, shuffle={shuffle}, seed=0, "
        f"drop_last), epoch advanced per pass"
    )
    return True


@functools.cache
def _global_order_sampler() -> type:
    from torch.utils.data import DistributedSampler

    class GlobalOrderSampler(DistributedSampler):
        """DistributedSampler whose epoch advances by itself at each pass over the
        loader, unless the script called set_epoch since the last pass."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._passes = 0
            self._epoch_set = False

        def set_epoch(self, epoch: int) -> None:
            super().set_epoch(epoch)
            self._epoch_set = True

        def __iter__(self) -> Any:
            if not self._epoch_set:
                self.epoch = self._passes
            self._passes += 1
            self._epoch_set = False
            return super().__iter__()

    return GlobalOrderSampler


def _scale_batch(label: str, arguments: dict[str, Any]) -> bool:
    assert RUN.status is not None
    where = _world_here()
    if where is not None and where[1] > 1:
        RUN.status.fail(
            f"this run has {where[1]} ranks: the single-rank baseline needs the launcher rewritten to one process"
        )
        return False
    text = os.environ.get(settings.VARIANT_WORLD_ENV, "").strip()
    if not text.isdigit() or int(text) < 1:
        RUN.status.fail(
            f"{settings.VARIANT_WORLD_ENV} is not set to the compared run's world size: batch left as it is"
        )
        return False
    world = int(text)
    if arguments.get("batch_sampler") is not None:
        RUN.status.fail(f"{label}: a custom batch_sampler sets the batch size; left as it is")
        return False
    batch = arguments.get("batch_size", 1)
    if not isinstance(batch, int):
        RUN.status.fail(f"{label}: no batch size to scale (batch_size={batch!r})")
        return False
    arguments["batch_size"] = batch * world
    RUN.status.ok(f"{label}: batch_size {batch} -> {batch * world}, the global batch of {world} ranks")
    return True


def install_single_lr() -> None:
    """single: every step runs at the compared run's learning rate (VARIANT_LR_ENV, its
    first step's) times the script's own schedule: the lr of each group is multiplied by
    wanted / (the script's lr at the first step) for the step, then put back, so a
    scheduler that reads the group's lr compounds nothing."""
    text = os.environ.get(settings.VARIANT_LR_ENV, "").strip()
    try:
        wanted = float(text)
    except ValueError:
        return  # no lr to match: the batch alone is scaled (what the event says)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    factors: dict[int, float] = {}

    def scale(optimizer: Any, up: bool) -> None:
        if id(optimizer) not in factors:
            if not up or not optimizer.param_groups:
                return
            own = float(optimizer.param_groups[0].get("lr", 0.0))
            factors[id(optimizer)] = wanted / own if own > 0 and wanted > 0 else 1.0
            if RUN.status is not None and factors[id(optimizer)] != 1.0:
                RUN.status.ok(f"lr {own:g} -> {wanted:g}, the compared run's at its first step")
        factor = factors[id(optimizer)]
        if factor != 1.0:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor if up else group["lr"] / factor

    register_optimizer_step_pre_hook(lambda opt, args, kwargs: safe(scale, opt, True))
    register_optimizer_step_post_hook(lambda opt, args, kwargs: safe(scale, opt, False))


def describe_real_loader(probe: Any) -> None:
    """A script that described its data pipeline to attach in a dict described the
    sampler this variant replaced: the snapshot takes the loader that now runs."""
    replaced = [ref() for ref in RUN.sharded]
    replaced = [loader for loader in replaced if loader is not None]
    if isinstance(probe.loader, dict) and len(replaced) == 1:
        probe.loader = replaced[0]
        assert RUN.status is not None
        RUN.status.ok("the loader dict given to attach replaced by the real loader")

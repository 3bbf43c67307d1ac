"""The start-of-run snapshot: what must be equal on every rank before step 1."""

from __future__ import annotations

from typing import Any

import torch

from syncdoctor.probe.core.snapshot import (
    HYPERPARAM_TYPES,
    build_common_snapshot,
    digest,
    public_scalars,
)

_HYPERPARAM_TYPES = HYPERPARAM_TYPES


def versions() -> dict[str, str]:
    import platform

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    try:
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # the probe reports; it never fails on a missing piece
        pass
    return out


def rng_digests() -> dict[str, str]:
    out = {"torch": digest(torch.get_rng_state().numpy().tobytes())}
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda"] = digest(torch.cuda.get_rng_state().numpy().tobytes())
    except Exception:
        pass
    return out


def hyperparams(obj: Any) -> dict[str, Any]:
    """Public scalar attributes of a loss module or similar object."""
    return public_scalars(obj)


def optimizer_info(optimizer: Any) -> dict[str, Any]:
    if optimizer is None:
        return {}
    groups = [
        {k: v for k, v in g.items() if k != "params" and isinstance(v, _HYPERPARAM_TYPES + (tuple,))}
        for g in optimizer.param_groups
    ]
    return {
        "type": type(optimizer).__name__,
        "param_groups": groups,
        "n_params": sum(len(g["params"]) for g in optimizer.param_groups),
    }


def loader_info(loader: Any) -> dict[str, Any]:
    """Sampler and loader settings of a torch DataLoader, or a dict given as is. The
    sharding fields carry the names every probe writes (docs/records.md): `num_replicas`,
    `rank` (the shard this rank reads), `seed`, `shuffle`, `epoch`; a loader whose
    sampler does not shard reads the whole dataset: num_replicas 1."""
    if loader is None or isinstance(loader, dict):
        return dict(loader or {})
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    info: dict[str, Any] = {
        "type": type(loader).__name__,
        "batch_size": getattr(loader, "batch_size", None),
        "drop_last": getattr(loader, "drop_last", None),
        "sampler": type(sampler).__name__ if sampler is not None else None,
    }
    # Where the sharding lives: a DistributedSampler (also inside a batch sampler, as
    # Lightning and accelerate nest it), or a batch-level shard (accelerate's
    # num_processes / process_index).
    for obj in (
        sampler,
        batch_sampler,
        getattr(batch_sampler, "sampler", None),
        getattr(batch_sampler, "batch_sampler", None),
    ):
        for attr, key in (
            ("num_replicas", "num_replicas"),
            ("rank", "rank"),
            ("num_processes", "num_replicas"),
            ("process_index", "rank"),
            ("shuffle", "shuffle"),
            ("seed", "seed"),
            ("epoch", "epoch"),
        ):
            value = getattr(obj, attr, None)
            if key not in info and isinstance(value, (int, float, str, bool)):
                info[key] = value
    plain = {type(sampler).__name__, type(batch_sampler).__name__} <= {
        "SequentialSampler",
        "RandomSampler",
        "BatchSampler",
    }
    if "num_replicas" not in info and plain:
        info["num_replicas"] = 1  # torch's own samplers: every rank reads the whole dataset
        info["shuffle"] = type(sampler).__name__ == "RandomSampler"
    try:
        info["dataset_len"] = len(loader.dataset)
    except Exception:
        pass
    return info


def ddp_info(model: Any) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(model, DDP):
        return {"wrapper": type(model).__name__, **_fully_shard_info(model)}
    return {
        "wrapper": "DistributedDataParallel",
        "broadcast_buffers": getattr(model, "broadcast_buffers", None),
        "find_unused_parameters": getattr(model, "find_unused_parameters", None),
        "gradient_as_bucket_view": getattr(model, "gradient_as_bucket_view", None),
        "bucket_cap_mb": getattr(model, "bucket_bytes_cap", 0) / 2**20 or None,
    }


def _fully_shard_info(model: Any) -> dict[str, Any]:
    """FSDP2 settings that must agree on every rank: the mixed-precision policy of
    every sharded module (a reduce dtype set on one rank only is a silent bug)."""
    policies = []
    for module in model.modules() if hasattr(model, "modules") else []:
        state = getattr(module, "_get_fsdp_state", None)
        if not callable(state):
            continue
        policy = getattr(state(), "_mp_policy", None)
        if policy is not None:
            policies.append({k: str(getattr(policy, k, None)) for k in ("param_dtype", "reduce_dtype", "output_dtype")})
    if not policies:
        return {}
    distinct = sorted({tuple(sorted(p.items())) for p in policies})
    return {"fully_shard": True, "mp_policies": [dict(p) for p in distinct]}


def build_snapshot(
    *,
    rank: int,
    world_size: int,
    model: Any,
    optimizer: Any,
    loss_fn: Any,
    loader: Any,
    global_batch: int | None,
    tensor_names: list[str],
    init_param_fp: int | None,
) -> dict[str, Any]:
    return build_common_snapshot(
        framework="torch",
        rank=rank,
        world_size=world_size,
        versions=versions(),
        rng=rng_digests(),
        seed={"torch_initial_seed": torch.initial_seed()},
        loss_fn=loss_fn,
        loss_params=hyperparams(loss_fn),
        optimizer=optimizer_info(optimizer),
        ddp=ddp_info(model),
        loader=loader_info(loader),
        global_batch=global_batch,
        tensor_names=tensor_names,
        init_param_fp=init_param_fp,
    )

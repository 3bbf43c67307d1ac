"""Agreement at a point every rank reaches: every rank's payload, or None on every rank
alike, through one compare-and-set in the job's store (bounded in time)."""

from __future__ import annotations

import time
from typing import Any

from syncdoctor.experiment.inrank.run import AGREE_MARGIN_S, AGREE_WAIT_S, POLL_S, RUN, STORE_CALL_S
from syncdoctor.probe.core.state import STATE


def rank_world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def variant_store() -> Any:
    if RUN.store is None:
        import torch.distributed as dist

        from syncdoctor.probe.torch.check import job_store

        RUN.store = dist.PrefixStore("syncdoctor/variant", job_store(STORE_CALL_S))
    return RUN.store


def wait_s() -> float:
    timeout = STATE.pg_timeout_s
    return min(AGREE_WAIT_S, float(timeout)) if timeout else AGREE_WAIT_S


def agree(topic: str, payload: str) -> list[str] | None:
    """Every rank's `payload` at a point every rank reaches (the k-th call for `topic`
    on each), or None, on every rank alike, when not all of them got there in time."""
    where = rank_world()
    if where is None:
        return None
    n = RUN.rounds.get(topic, 0)
    RUN.rounds[topic] = n + 1
    return agree_on(variant_store(), f"{topic}/{n}", where[0], where[1], payload, wait_s())


def agree_on(store: Any, prefix: str, rank: int, world: int, payload: str, wait_s: float) -> list[str] | None:
    """The agreement itself, over a c10d store. Rank 0 decides "go" once it has seen
    every rank; a rank tired of waiting decides "late"; the store's compare-and-set
    keeps whichever came first, so every rank acts alike: all meet in what follows
    (a broadcast), or none does. Non-zero ranks wait AGREE_MARGIN_S longer than rank 0."""
    keys = [f"{prefix}/{r}" for r in range(world)]
    decision = f"{prefix}/decision"
    store.set(keys[rank], payload)
    deadline = time.monotonic() + wait_s + (0.0 if rank == 0 else AGREE_MARGIN_S)
    watched = keys if rank == 0 else [decision]
    while not store.check(watched) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    wanted = "go" if rank == 0 and store.check(keys) else "late"
    if store.compare_set(decision, "", wanted) != b"go":
        return None
    return [v.decode() for v in store.multi_get(keys)]


def late(where: str) -> str:
    return f"not every rank reached {where} within {wait_s():.0f} s, so none changed anything"

"""What one variant of `syncdoctor experiment` changes inside a rank process.

The orchestrator reruns the user's job with SYNCDOCTOR_VARIANT set (settings.VARIANTS);
the patches here apply that one change with no edit of the script, and each rank
writes ONE event record `event="variant"` saying what was done (`applied`, `what`) or
why it could not be (`why`), at the end of its first optimizer step.

- seeds: python `random`, numpy and torch are seeded with one constant at start, and
  every later seeding call (torch.manual_seed/seed, torch.cuda.manual_seed(_all),
  random.seed, numpy.random.seed/default_rng/RandomState, DistributedSampler's seed,
  unseeded calls included) gets a value that depends only on the constant, the API
  and how many calls of that API came before: the same on every rank.
- broadcast: rank 0's parameters and floating buffers are broadcast over the job's
  default group where the probe takes the model (DDP construction, attach, or the first
  backward/step of a loop without DDP): every rank is at that point.
- hparams: rank 0's optimizer param-group scalars and the loss object's public scalar
  attributes are forced on every rank before every optimizer step, through the job's
  c10d store: rank 0 publishes what it will use at its n-th step, and the others wait
  (bounded) until rank 0 has reached its n-th step, so a value rank 0 changes between
  steps is used by every rank at the same step.
- data: a map-style DataLoader's sampler becomes a DistributedSampler over one global
  order (seed 0, drop_last), its epoch advanced at each pass over the loader.
- modes: at the first grad-enabled forward rank 0's train/eval flags of every module
  are taken and re-applied at every grad-enabled forward.
- single: in the one-rank rerun, a DataLoader's batch size is multiplied by the world
  size of the compared run (SYNCDOCTOR_VARIANT_WORLD), so a step sees the same global batch.

Safety: every patch runs its own work under `_safe`: on any failure the variant
records applied=False with the reason and training continues unchanged. The one
cross-rank agreement (`_agree`) is bounded in time and decided through one atomic
compare-and-set in the store, so either every rank acts (and meets the others in the
broadcast) or none does. Framework-free at import: torch and numpy are imported in
the functions that need them.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from typing import Any

from syncdoctor import settings
from syncdoctor.probe.core import hook_points, safety
from syncdoctor.probe.core.state import STATE

SEED = 20_261_130  # the one constant every rank's random generators start from
AGREE_WAIT_S = 60.0  # the most a rank waits for the others at a point they all reach
AGREE_MARGIN_S = 10.0  # non-zero ranks wait this much longer than rank 0 before giving up
POLL_S = 0.005
STORE_CALL_S = 10.0  # the most one store call may take
MAX_NOTES = 8
VARIANT_MARK = "_syncdoctor_variant"  # on each function a variant put in place (the probe has its own mark)


class _Status:
    """What the variant did in this process, written once as the variant event."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applied: bool | None = None
        self.what: list[str] = []
        self.why: list[str] = []
        self.written = False
        self.seed_calls: dict[str, int] = {}
        self.changed: int | None = None  # values this rank had to change (differs by rank, unlike `what`)

    def ok(self, what: str) -> None:
        self.applied = True
        if len(self.what) < MAX_NOTES:
            self.what.append(what)

    def fail(self, why: str) -> None:
        if self.applied is None:
            self.applied = False
        if len(self.why) < MAX_NOTES:
            self.why.append(why)

    def record(self) -> dict[str, Any]:
        if self.name == "seeds" and self.applied:
            self.changed = sum(self.seed_calls.values())
            self.what.append("every later seeding call rewritten alike (" + ", ".join(sorted(self.seed_calls)) + ")")
        if self.applied:
            out: dict[str, Any] = {"name": self.name, "applied": True, "what": "; ".join(self.what)}
            if self.changed is not None:
                out["changed"] = self.changed
            if self.why:  # applied to part of the script: say what was left as it was
                out["why"] = "; ".join(self.why)
            return out
        why = "; ".join(self.why) or _NOT_REACHED.get(self.name, "the script never reached the point it acts at")
        return {"name": self.name, "applied": False, "why": why}


_NOT_REACHED = {
    "broadcast": "no model was taken by the probe before the first optimizer step",
    "hparams": "no optimizer was bound before the first optimizer step",
    "data": "no torch DataLoader was built before the first optimizer step (the script feeds its batches another way)",
    "single": "no torch DataLoader was built before the first optimizer step: the batch size could not be scaled",
    "modes": "no grad-enabled forward of a module with trainable parameters before the first optimizer step",
}

_status: _Status | None = None
_local = threading.local()  # .seeding: inside a rewritten seeding call (its inner calls pass through)
_state: dict[str, Any] = {"store": None, "rounds": {}, "broadcast_done": None, "loaders": 0, "hparams": None}


def variant() -> str | None:
    """The variant this process runs under (None: a plain run)."""
    return _status.name if _status is not None else None


def _variant_failed(exc: BaseException) -> None:
    if _status is not None:
        _status.fail(f"{type(exc).__name__}: {exc}"[:300])


# A variant must never change what the program does beyond itself: a failure marks it failed.
_safe = safety.guard(on_error=_variant_failed)


def _is_helper() -> bool:
    from syncdoctor.probe.core import process

    return process.is_helper()


# ---------------------------------------------------------------------- install
def install_torch() -> None:
    """Called once torch is imported in a process of `syncdoctor run` (probe/torch/attach.py)."""
    global _status
    name = os.environ.get(settings.VARIANT_ENV, "").strip()
    if not name or _status is not None:
        return
    _status = _Status(name)
    if name not in settings.VARIANTS:
        _status.fail(f"unknown variant {name!r} (known: {', '.join(settings.VARIANTS)})")
    elif name == "seeds":
        _safe(_install_seeds)
    elif name in ("data", "single"):
        _safe(_patch_loader)
        if name == "single":
            _safe(_install_single_lr)
    elif name == "hparams":
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda opt, args, kwargs: _safe(_hparams_before_step, opt))
    elif name == "modes":
        from torch.nn.modules.module import register_module_forward_pre_hook

        _state["modes_hook"] = register_module_forward_pre_hook(lambda module, args: _safe(_modes_first, module))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _state["post_hook"] = register_optimizer_step_post_hook(lambda opt, args, kwargs: _safe(_write_event, opt))


def _write_event(optimizer: Any) -> None:
    """The end of the first optimizer step of a watched optimizer: write the record."""
    from syncdoctor.records import contract

    if _status is None or _status.written:
        return
    probe = next((p for p in STATE.probes if p.optimizer is optimizer), None)
    if probe is None:
        return
    _status.written = True
    handle = _state.pop("post_hook", None)
    if handle is not None:
        handle.remove()
    record = _status.record()
    state = "applied" if record["applied"] else "not applied"
    detail = record.get("what") if record["applied"] else record.get("why")
    probe.writer.write(
        contract.KIND_EVENT,
        rank=probe.rank,
        t=time.time(),
        step=probe.step,
        event="variant",
        message=f"experiment variant {record['name']} {state}: {detail}"[:2000],
        variant=record,
    )


# ---------------------------------------------------------------------- agreement
def _rank_world() -> tuple[int, int] | None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size()


def _store() -> Any:
    if _state["store"] is None:
        import torch.distributed as dist

        from syncdoctor.probe.torch.check import job_store

        _state["store"] = dist.PrefixStore("syncdoctor/variant", job_store(STORE_CALL_S))
    return _state["store"]


def _wait_s() -> float:
    timeout = STATE.pg_timeout_s
    return min(AGREE_WAIT_S, float(timeout)) if timeout else AGREE_WAIT_S


def _agree(topic: str, payload: str) -> list[str] | None:
    """Every rank's `payload` at a point every rank reaches (the k-th call for `topic`
    on each), or None, on every rank alike, when not all of them got there in time."""
    where = _rank_world()
    if where is None:
        return None
    n = _state["rounds"].get(topic, 0)
    _state["rounds"][topic] = n + 1
    return agree_on(_store(), f"{topic}/{n}", where[0], where[1], payload, _wait_s())


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


def _late(where: str) -> str:
    return f"not every rank reached {where} within {_wait_s():.0f} s, so none changed anything"


# ---------------------------------------------------------------------- seeds
def _derived(api: str) -> int:
    """The value the next seeding call of `api` gets: the same on every rank."""
    assert _status is not None
    k = _status.seed_calls.get(api, 0)
    _status.seed_calls[api] = k + 1
    return zlib.crc32(f"{SEED}/{api}/{k}".encode()) & 0x7FFFFFFF


def _passes_through() -> bool:
    # A data-loader worker (a helper process) is seeded from its rank's generators,
    # already equal across ranks: its own seeding stays as torch does it.
    return getattr(_local, "seeding", False) or _is_helper()


def _seeding(api: str, original: Callable[..., Any], arg: str) -> Callable[..., Any]:
    """`original` with its seed argument `arg` (first positional) replaced."""
    signature = inspect.signature(original) if _has_signature(original) else None

    @functools.wraps(original)
    def seeded(*args: Any, **kwargs: Any) -> Any:
        if _passes_through():
            return original(*args, **kwargs)
        value = _derived(api)
        if args:
            args = (value, *args[1:])
        elif arg in kwargs or signature is None or arg in signature.parameters:
            kwargs[arg] = value
        _local.seeding = True
        try:
            return original(*args, **kwargs)
        finally:
            _local.seeding = False

    seeded._syncdoctor_variant = True  # type: ignore[attr-defined]
    return seeded


def _has_signature(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn)
        return True
    except (TypeError, ValueError):
        return False


def _replace(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    safety.patch_once(owner, name, make, mark=VARIANT_MARK)


def _install_seeds() -> None:
    import random

    import torch

    assert _status is not None
    random.seed(SEED)
    torch.manual_seed(SEED)
    manual_seed = _seeding("torch.manual_seed", torch.manual_seed, "seed")
    torch.manual_seed = manual_seed
    torch.random.manual_seed = manual_seed

    def torch_seed() -> int:
        if _passes_through():
            return original_seed()
        value = _derived("torch.seed")
        _local.seeding = True
        try:
            original_manual_seed(value)
        finally:
            _local.seeding = False
        return value

    original_seed, original_manual_seed = torch.seed, manual_seed.__wrapped__  # type: ignore[attr-defined]  # functools.wraps
    torch_seed._syncdoctor_variant = True  # type: ignore[attr-defined]
    torch.seed = torch_seed
    torch.random.seed = torch_seed
    _replace(torch.cuda, "manual_seed", lambda f: _seeding("torch.cuda.manual_seed", f, "seed"))
    _replace(torch.cuda, "manual_seed_all", lambda f: _seeding("torch.cuda.manual_seed_all", f, "seed"))
    _replace(random, "seed", lambda f: _seeding("random.seed", f, "a"))
    from torch.utils.data import distributed

    _replace(distributed.DistributedSampler, "__init__", _sampler_seed)
    if "numpy" in sys.modules:
        _install_numpy_seeds()
    else:
        from syncdoctor.probe.core import process

        process.when_imported("numpy", lambda: _safe(_install_numpy_seeds))
    _status.ok(f"random, numpy and torch seeded with {SEED} at start")


def _sampler_seed(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not _passes_through():
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["seed"] = _derived("DistributedSampler.seed")
            args, kwargs = bound.args[1:], bound.kwargs
        original(self, *args, **kwargs)

    __init__._syncdoctor_variant = True  # type: ignore[attr-defined]
    return __init__


def _install_numpy_seeds() -> None:
    import numpy as np

    np.random.seed(SEED % 2**32)
    _replace(np.random, "seed", lambda f: _seeding("numpy.random.seed", f, "seed"))

    def make_default_rng(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def default_rng(seed: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(seed, (np.random.Generator, np.random.BitGenerator)) or _passes_through():
                return original(seed, *args, **kwargs)  # an existing generator: no new seed
            return original(_derived("numpy.random.default_rng"), *args, **kwargs)

        default_rng._syncdoctor_variant = True  # type: ignore[attr-defined]
        return default_rng

    _replace(np.random, "default_rng", make_default_rng)
    base = np.random.RandomState
    if not getattr(base, VARIANT_MARK, False):

        class RandomState(base):  # type: ignore[misc, valid-type]
            """numpy's RandomState whose seed (None included) is the rank-independent one."""

            _syncdoctor_variant = True

            def __init__(self, seed: Any = None) -> None:
                if not _passes_through():
                    seed = _derived("numpy.random.RandomState")
                super().__init__(seed)

        RandomState.__module__ = base.__module__
        np.random.RandomState = RandomState  # type: ignore[misc]  # numpy's class, replaced on purpose


# ---------------------------------------------------------------------- broadcast
def before_ddp(module: Any) -> None:
    """DistributedDataParallel is being built on `module` (every rank is there)."""
    if variant() == "broadcast":
        _safe(_broadcast, module, "DDP construction")


def before_watch(module: Any) -> None:
    """The probe takes `module` (attach, DDP, or the first backward/step of a loop
    without DDP): every rank is there, and the initial weights are fingerprinted next."""
    if variant() == "broadcast":
        _safe(_broadcast, module, "the probe's attach")


def _sharded(tensors: list[Any], module: Any) -> bool:
    if any(hasattr(m, "_get_fsdp_state") or type(m).__name__ == "FullyShardedDataParallel" for m in module.modules()):
        return True
    return any(type(t).__name__ == "DTensor" for t in tensors)


def _broadcast(module: Any, where: str) -> None:
    import torch
    import torch.distributed as dist

    assert _status is not None
    done = _state["broadcast_done"]
    if done is None:
        done = _state["broadcast_done"] = weakref.WeakSet()
    inner = getattr(module, "module", module)
    if module in done or inner in done:
        return
    done.add(module)
    params = list(module.parameters())
    buffers = [b for b in module.buffers() if b.is_floating_point()]
    tensors = params + buffers
    shapes = [(tuple(t.shape), str(t.dtype)) for t in tensors]
    signature = json.dumps({"sharded": _sharded(tensors, module), "shapes": zlib.crc32(repr(shapes).encode())})
    everyone = _agree("broadcast", signature)
    if everyone is None:
        _status.fail("no process group when the model was taken" if _rank_world() is None else _late(where))
        return
    if any(json.loads(s)["sharded"] for s in everyone):
        _status.fail(
            "the parameters are sharded (FSDP or DTensor): each rank holds other values by design, "
            "there is no full replica to broadcast"
        )
        return
    if len(set(everyone)) > 1:
        _status.fail(f"the model taken at {where} has other parameter shapes on some ranks: nothing was broadcast")
        return
    if len(everyone) < 2:
        _status.fail("one rank: there is nothing to broadcast to")
        return
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t.detach(), src=0)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    _status.ok(
        f"rank 0's {len(params)} parameters and {len(buffers)} buffers of {type(module).__name__} "
        f"({nbytes:,} bytes) broadcast at {where}"
    )


# ---------------------------------------------------------------------- hparams
_SCALARS = (bool, int, float, str)


def _scalar(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    return isinstance(value, (tuple, list)) and 0 < len(value) <= 8 and all(isinstance(v, _SCALARS) for v in value)


def _loss_objects(probe: Any) -> tuple[list[tuple[str, Any]], str]:
    """The loss objects whose attributes are forced, and where they were found."""
    if probe.loss_fn is not None and hasattr(probe.loss_fn, "__dict__"):
        return [("loss_fn", probe.loss_fn)], f"{type(probe.loss_fn).__name__}, given to the probe"
    import torch

    main = sys.modules.get("__main__")
    found = []
    for name, value in sorted(vars(main).items() if main is not None else []):
        if isinstance(value, torch.nn.Module) and next(value.parameters(), None) is None and not name.startswith("_"):
            found.append((name, value))
    if not found:
        return [], "no loss object known (none given to the probe, no parameter-free module in __main__)"
    return found, "parameter-free modules of __main__: " + ", ".join(f"{n} ({type(v).__name__})" for n, v in found)


def _public_scalars(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in sorted(vars(obj).items()) if not k.startswith("_") and k != "training" and _scalar(v)}


def _hparams_payload(optimizer: Any, losses: list[tuple[str, Any]]) -> str:
    groups = [{k: v for k, v in sorted(g.items()) if k != "params" and _scalar(v)} for g in optimizer.param_groups]
    return json.dumps({"groups": groups, "loss": {name: _public_scalars(obj) for name, obj in losses}})


def _same(current: Any, wanted: Any) -> bool:
    return (list(current) if isinstance(current, tuple) else current) == wanted


def _apply_hparams(optimizer: Any, losses: list[tuple[str, Any]], published: dict[str, Any]) -> int:
    """Set rank 0's values here; returns how many differed."""
    changed = 0
    for group, values in zip(optimizer.param_groups, published.get("groups", []), strict=False):
        for key, value in values.items():
            if key in group and _scalar(group[key]) and not _same(group[key], value):
                group[key] = tuple(value) if isinstance(group[key], tuple) else value
                changed += 1
    objects = dict(losses)
    for name, values in published.get("loss", {}).items():
        obj = objects.get(name)
        for key, value in values.items() if obj is not None else ():
            current = getattr(obj, key, None)
            if _scalar(current) and not _same(current, value):
                setattr(obj, key, tuple(value) if isinstance(current, tuple) else value)
                changed += 1
    return changed


def before_snapshot(probe: Any, optimizer: Any) -> None:
    """The probe binds `optimizer` and is about to write the configuration it sees
    (attach, or the first step of a job attached zero-code): every rank is there."""
    if variant() == "hparams":
        _safe(_hparams_start, probe, optimizer)
    elif variant() == "data":
        _safe(_describe_real_loader, probe)


def _describe_real_loader(probe: Any) -> None:
    """A script that described its data pipeline to attach in a dict described the
    sampler this variant replaced: the snapshot takes the loader that now runs."""
    replaced = [ref() for ref in _state.get("sharded", [])]
    replaced = [loader for loader in replaced if loader is not None]
    if isinstance(probe.loader, dict) and len(replaced) == 1:
        probe.loader = replaced[0]
        assert _status is not None
        _status.ok("the loader dict given to attach replaced by the real loader")


def _hparams_start(probe: Any, optimizer: Any) -> None:
    assert _status is not None
    if _state["hparams"] is not None:
        return  # a second optimizer: the first one is the one forced
    losses, source = _loss_objects(probe)
    payload = _hparams_payload(optimizer, losses)
    everyone = _agree("hparams", payload)
    if everyone is None:
        _status.fail(
            "no process group when the optimizer was bound"
            if _rank_world() is None
            else _late("the optimizer's binding")
        )
        return
    published = json.loads(everyone[0])
    changed = _apply_hparams(optimizer, losses, published)
    rank = _rank_world()[0]  # type: ignore[index]
    _state["hparams"] = {
        "optimizer": optimizer,
        "losses": losses,
        "rank": rank,
        "last": everyone[0],  # rank 0: what it published; the others: what they apply
        "published": published,
        "version": 0,
        "steps": 0,  # this rank's optimizer steps since the binding
        "wait_s": _wait_s(),
    }
    keys = {k for g in published["groups"] for k in g}
    attrs = sorted({k for values in published["loss"].values() for k in values})
    _status.changed = changed
    _status.ok(
        f"rank 0's {len(keys)} optimizer settings and loss attributes ({', '.join(attrs) or 'none'}) forced "
        f"before every step; loss: {source}"
    )


def _hparams_before_step(optimizer: Any) -> None:
    """Every step: rank 0 publishes what changed, then that it reached this step; the
    others wait for that (a rank after the backward's all-reduce is rarely more than a
    moment ahead of rank 0, but without the wait a value rank 0 changed between steps
    reached them one step late: the replicas parted for good, measured on an accelerate
    script that decays the lr on the main process only). A wait that runs out ends
    the waiting for the rest of the run, and says so (`_note`)."""
    hp = _state["hparams"]
    if hp is None or hp["optimizer"] is not optimizer:
        return
    store = _store()
    hp["steps"] += 1
    try:
        if hp["rank"] == 0:
            payload = _hparams_payload(optimizer, hp["losses"])
            if payload != hp["last"]:
                store.set("hparams/latest", payload)
                store.add("hparams/version", 1)
                hp["last"] = payload
            store.add("hparams/steps", 1)  # after the payload: a rank that sees n sees step n's values
            return
        if hp["wait_s"]:
            deadline = time.monotonic() + hp["wait_s"]
            while store.add("hparams/steps", 0) < hp["steps"]:
                if time.monotonic() > deadline:
                    hp["wait_s"] = 0.0
                    _note(
                        f"rank 0 had not reached optimizer step {hp['steps']} after {_wait_s():.0f} s: "
                        "later steps take its latest values without waiting"
                    )
                    break
                time.sleep(POLL_S)
        version = store.add("hparams/version", 0)
        if version != hp["version"]:
            hp["published"] = json.loads(store.get("hparams/latest"))
            hp["version"] = version
        _apply_hparams(optimizer, hp["losses"], hp["published"])
    except Exception as exc:  # the store is gone (the job ends): stop forcing, say so
        _state["hparams"] = None
        _note(f"stopped forcing at a step: the store did not answer ({type(exc).__name__})")


def _note(why: str) -> None:
    """What a variant gave up after it was applied: in its event when that is still to
    be written (after the first step), and on stderr, where the run's log keeps it."""
    if _status is not None:
        _status.why.append(why)
        print(f"syncdoctor: variant {_status.name}: {why}", file=sys.stderr)


# ---------------------------------------------------------------------- modes
def _modes_first(module: Any) -> None:
    """Global forward pre-hook until the first grad-enabled forward of a module with
    trainable parameters (the outermost one: its pre-hook runs before its children's)."""
    import torch

    if not torch.is_grad_enabled() or not any(p.requires_grad for p in module.parameters()):
        return
    handle = _state.pop("modes_hook", None)
    if handle is None:
        return
    handle.remove()
    assert _status is not None
    modules = list(module.modules())
    flags = "".join("1" if m.training else "0" for m in modules)
    everyone = _agree("modes", flags)
    if everyone is None:
        _status.fail(
            "no process group at the first training forward"
            if _rank_world() is None
            else _late("the first training forward")
        )
        return
    wanted = everyone[0]
    if len(wanted) != len(modules):
        _status.fail(
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
    _status.changed = differed
    _status.ok(
        f"rank 0's train/eval flags of {len(modules)} modules of {type(module).__name__} "
        f"({wanted.count('1')} in train mode) re-applied at every training forward"
    )


# ---------------------------------------------------------------------- data and single
def _patch_loader() -> None:
    from torch.utils.data import DataLoader

    original = DataLoader.__init__
    if getattr(original, VARIANT_MARK, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not _is_helper():
            rewritten = _safe(_rewrite_loader, signature, self, args, kwargs)
            if rewritten is not None:
                args, kwargs = rewritten
        original(self, *args, **kwargs)

    __init__._syncdoctor_variant = True  # type: ignore[attr-defined]
    DataLoader.__init__ = __init__  # type: ignore[method-assign]  # patched on purpose


def _world_here() -> tuple[int, int] | None:
    where = _rank_world()
    if where is not None:
        return where
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit():
        return int(rank), int(world)
    return None


def _rewrite_loader(signature: inspect.Signature, loader: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    assert _status is not None
    bound = signature.bind(loader, *args, **kwargs)
    arguments = bound.arguments
    _state["loaders"] += 1
    label = f"DataLoader #{_state['loaders']} ({type(arguments['dataset']).__name__})"
    change = _shard_loader if _status.name == "data" else _scale_batch
    if not change(label, arguments):
        return None
    _state.setdefault("sharded" if _status.name == "data" else "scaled", []).append(weakref.ref(loader))
    return bound.args[1:], bound.kwargs


def _shard_loader(label: str, arguments: dict[str, Any]) -> bool:
    from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

    assert _status is not None
    dataset = arguments["dataset"]
    if isinstance(dataset, IterableDataset):
        _status.fail(f"{label}: an IterableDataset decides its own order and split; there is no sampler to replace")
        return False
    if arguments.get("batch_sampler") is not None:
        _status.fail(
            f"{label}: a custom batch_sampler ({type(arguments['batch_sampler']).__name__}) picks the batches; left as it is"
        )
        return False
    where = _world_here()
    if where is None:
        _status.fail(f"{label}: built before the process group, and no RANK/WORLD_SIZE in the environment")
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
    _status.ok(
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
    assert _status is not None
    where = _world_here()
    if where is not None and where[1] > 1:
        _status.fail(
            f"this run has {where[1]} ranks: the single-rank baseline needs the launcher rewritten to one process"
        )
        return False
    text = os.environ.get(settings.VARIANT_WORLD_ENV, "").strip()
    if not text.isdigit() or int(text) < 1:
        _status.fail(f"{settings.VARIANT_WORLD_ENV} is not set to the compared run's world size: batch left as it is")
        return False
    world = int(text)
    if arguments.get("batch_sampler") is not None:
        _status.fail(f"{label}: a custom batch_sampler sets the batch size; left as it is")
        return False
    batch = arguments.get("batch_size", 1)
    if not isinstance(batch, int):
        _status.fail(f"{label}: no batch size to scale (batch_size={batch!r})")
        return False
    arguments["batch_size"] = batch * world
    _status.ok(f"{label}: batch_size {batch} -> {batch * world}, the global batch of {world} ranks")
    return True


def _install_single_lr() -> None:
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
            if _status is not None and factors[id(optimizer)] != 1.0:
                _status.ok(f"lr {own:g} -> {wanted:g}, the compared run's at its first step")
        factor = factors[id(optimizer)]
        if factor != 1.0:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor if up else group["lr"] / factor

    register_optimizer_step_pre_hook(lambda opt, args, kwargs: _safe(scale, opt, True))
    register_optimizer_step_post_hook(lambda opt, args, kwargs: _safe(scale, opt, False))


def environment(name: str) -> dict[str, str]:
    """What a rank process needs in its environment to run under variant `name`: the
    variant, and this module among the boot's plugins (it registers below)."""
    return {settings.VARIANT_ENV: name, settings.PLUGINS_ENV: __name__}


# Imported by the boot of a rank process (settings.PLUGINS_ENV): act at the probe's hook points.
hook_points.register(hook_points.TORCH_PATCHED, install_torch)
hook_points.register(hook_points.BEFORE_DDP, before_ddp)
hook_points.register(hook_points.BEFORE_WATCH, before_watch)
hook_points.register(hook_points.BEFORE_SNAPSHOT, before_snapshot)

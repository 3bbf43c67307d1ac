"""Zero-code attach for torch: the patches `syncdoctor run` applies right after
`torch` is imported in a process (see boot.py). Each one calls the original first or
last and does its own work under `_safe`, so the user's program sees the same
results, the same exceptions and the same exit code.

- `init_process_group`: the process is a rank; remember the group timeout (the
  probe's check never waits longer) and tee the output to logs/rank{R}.log.
- `DistributedDataParallel.__init__`: fingerprint the replica before DDP's broadcast
  (an unseeded init is otherwise hidden), then attach a probe to the new wrapper.
- global optimizer step pre- and post-hooks: bind the probe to the optimizer before
  its first update (the initial weights are fingerprinted then); without DDP (a
  hand-written all-reduce loop) create the probe there.
- `torch.autograd.backward`: a scalar reaching backward() is the loss.
- `GradScaler._maybe_opt_step`: the loss scale, and the skipped step on overflow.
- `DataLoader.__init__`, `_Loss.__init__`: remember them for the snapshot.
- `destroy_process_group`: close the probe first (exit and uncaught exceptions are
  handled by the probe's own atexit close).
"""

from __future__ import annotations

import atexit
import gc
import inspect
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from syncdoctor.probe.core import hook_points, process, safety
from syncdoctor.probe.core.state import STATE
from syncdoctor.probe.torch import hooks
from syncdoctor.probe.torch import probe as core

MAX_TRACKED = 16  # loaders / loss modules remembered for the snapshot
_loaders: list[weakref.ref[Any]] = []
_loss_modules: list[weakref.ref[Any]] = []


def _stand_down(exc: BaseException) -> None:
    """A patch failed: the probe stands down on this rank; the patches call the originals only."""
    STATE.stood_down = True
    safety.stand_down(exc, list(STATE.probes))


_safe = safety.guard(on_error=_stand_down)


def _is_rank() -> bool:
    if process.is_helper() or STATE.stood_down:
        return False
    return (dist.is_available() and dist.is_initialized()) or process.launcher_rank() is not None


def _probe_kwargs() -> dict[str, Any]:
    rank = dist.get_rank() if dist.is_initialized() else process.launcher_rank() or 0
    folder = process.run_dir() or core.DEFAULT_RUN_DIR
    return {
        "run_dir": folder,
        "check_timeout_s": STATE.pg_timeout_s,
        "auto": True,
        "log_path": os.path.join(folder, "logs", f"rank{rank}.log"),
    }


def _new_probe(model: torch.nn.Module, **kwargs: Any) -> core.Probe:
    probe = core.Probe(model, None, **_probe_kwargs(), **kwargs)
    for loss in STATE.pending_losses:
        probe.on_backward_call(loss)
    STATE.pending_losses = []
    if STATE.pending_scale is not None:  # read by the scaler before this first step
        probe.scale(STATE.pending_scale)
        STATE.pending_scale = None
    return probe


# ---------------------------------------------------------------------- process group
def _after_init(args: tuple[Any, ...], kwargs: dict[str, Any], original: Callable[..., Any]) -> None:
    bound = inspect.signature(original).bind_partial(*args, **kwargs).arguments
    timeout = bound.get("timeout")
    if timeout is None:
        backend = bound.get("backend") or dist.get_backend()
        timeout = dist.distributed_c10d._get_default_timeout(backend)
    STATE.pg_timeout_s = float(timeout.total_seconds())
    process.become_rank(dist.get_rank())


def _close_all(status: str = "ok", message: str = "") -> None:
    for probe in list(STATE.probes):
        probe.close(status, message)


# ---------------------------------------------------------------------- DDP
def _attach_ddp(ddp: Any, pre_sync_fp: int | None) -> None:
    if core.probe_for_module(ddp) is None and _is_rank():
        _new_probe(ddp, init_param_fp_local=pre_sync_fp)


def _local_fp(module: torch.nn.Module) -> int:
    from syncdoctor.probe.core.fingerprint import combine
    from syncdoctor.probe.torch.fingerprint import fingerprints

    return combine(fingerprints(p for p in module.parameters() if p.requires_grad))


# ---------------------------------------------------------------------- optimizer
class _ParamsView(torch.nn.Module):
    """Stands in for the model when no module holding the optimizer's parameters was
    found: names them by param group and position."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        super().__init__()
        self._named = [
            (f"group{g}.param{i}", p)
            for g, group in enumerate(optimizer.param_groups)
            for i, p in enumerate(group["params"])
        ]

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        return iter(self._named)


def _module_holding(wanted: set[int]) -> torch.nn.Module | None:
    """The root module that holds every parameter in `wanted` (ids), the smallest such
    (once per process, so a scan of live objects is affordable)."""
    # type(), not isinstance(): isinstance reads `__class__`, which some module-level
    # objects answer with a deprecation warning (torch.distributed.reduce_op).
    modules = [o for o in gc.get_objects() if issubclass(type(o), torch.nn.Module)]
    children = {id(c) for m in modules for c in m.children()}
    best: tuple[int, int, torch.nn.Module] | None = None
    for module in modules:
        if id(module) in children or isinstance(module, _ParamsView):
            continue
        ids = [id(p) for p in module.parameters()]
        overlap = sum(1 for i in ids if i in wanted)
        if overlap and (best is None or (overlap, -len(ids)) > best[:2]):
            best = (overlap, -len(ids), module)
    if best is not None and best[0] == len(wanted):
        return best[2]
    return None


def _find_module(optimizer: torch.optim.Optimizer) -> torch.nn.Module:
    """The root module whose parameters the optimizer updates (at the first step of a
    hand-written data-parallel loop)."""
    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    return _module_holding(wanted) or _ParamsView(optimizer)


def _graph_parameters(loss: torch.Tensor, limit: int = 100_000) -> set[int]:
    """Ids of the leaf tensors requiring grad that `loss` was computed from (its
    autograd graph's AccumulateGrad nodes)."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [loss.grad_fn]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if isinstance(variable, torch.Tensor):
            found.add(id(variable))
        stack.extend(fn for fn, _ in getattr(node, "next_functions", ()))
    return found


def _probe_before_first_backward(loss: torch.Tensor) -> bool:
    """A loop without DDP: create the probe at the first backward, before it runs, so
    the first iteration is measured in full (its local gradients before the
    hand-written all-reduce, the parameters before any update). The optimizer is
    bound at its first step."""
    STATE.early_tried = True
    wanted = _graph_parameters(loss)
    module = _module_holding(wanted) if wanted else None
    if module is None or any(hasattr(m, "_get_fsdp_state") for m in module.modules()):
        # FSDP2 swaps its parameters for unsharded copies during forward and backward and
        # frees their storage afterwards: the probe must see the sharded ones, at the
        # optimizer's first step (before the update).
        return False
    probe = _new_probe(module)
    probe.created_at_backward = True  # type: ignore[attr-defined]
    probe.backward = STATE.backward_calls - 1  # this backward is counted by the probe's own hook
    probe.on_backward_call(loss)
    return True


def _discard(probe: core.Probe) -> None:
    """Drop a probe created at the first backward that turned out to watch another
    model than the one the first optimizer step updates (it has written nothing)."""
    probe.remove_hooks()
    probe.closed = True
    probe.writer.close()
    if probe in STATE.probes:
        STATE.probes.remove(probe)
    atexit.unregister(probe._close_at_exit)


def _latest(refs: list[weakref.ref[Any]], prefer: Callable[[Any], bool]) -> Any:
    alive = [obj for obj in (r() for r in refs) if obj is not None]
    preferred = [obj for obj in alive if _safe(prefer, obj)]
    return (preferred or alive or [None])[0]


def _bind(probe: core.Probe, optimizer: torch.optim.Optimizer) -> None:
    """The optimizer's first step: everything the snapshot needs is built by now."""
    if probe.loader is None:
        probe.loader = _latest(_loaders, lambda d: "Distributed" in type(getattr(d, "sampler", None)).__name__)
    if probe.loss_fn is None:
        probe.loss_fn = _latest(_loss_modules, lambda _m: True)
    if probe.global_batch is None and probe.loader is not None:
        batch = getattr(probe.loader, "batch_size", None)
        micro = max(1, probe.backward - probe._backward_at_last_step)
        if isinstance(batch, int):
            probe.global_batch = batch * probe.world_size * micro
    probe.bind_optimizer(optimizer)


def _probe_for_optimizer(optimizer: torch.optim.Optimizer, create: bool) -> tuple[core.Probe | None, bool]:
    """(probe, bound_now): the probe recording this optimizer, binding or creating one."""
    for probe in STATE.probes:
        if probe.optimizer is optimizer:
            return probe, False
    for probe in STATE.probes:
        if probe.optimizer is None and probe.owns(optimizer):
            _bind(probe, optimizer)
            return probe, True
    if not create or any(p.owns(optimizer) for p in STATE.probes) or not _is_rank():
        return None, False  # a second optimizer of a watched model, or not a rank
    for probe in [p for p in STATE.probes if p.optimizer is None and getattr(p, "created_at_backward", False)]:
        _discard(probe)
    probe = _new_probe(_find_module(optimizer))
    probe.backward = STATE.backward_calls  # the backward passes before this first step
    _bind(probe, optimizer)
    return probe, True


def _bound_already(optimizer: torch.optim.Optimizer) -> bool:
    """Every step after an optimizer's first: its probe is bound. These global hooks run
    at every step of every optimizer, so this is all they do then (it cannot raise).
    A loop, not any(): a generator costs more than the loop at every step."""
    for probe in STATE.probes:  # noqa: SIM110
        if probe.optimizer is optimizer:
            return True
    return False


def _before_any_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Bind (or, without DDP, create) the probe before the optimizer's first update, so
    that the snapshot's initial weights are the weights training started from."""
    if not _bound_already(optimizer):
        _safe(_probe_for_optimizer, optimizer, True)


def _on_any_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    if _bound_already(optimizer):
        return
    probe, bound_now = _safe(_probe_for_optimizer, optimizer, True) or (None, False)
    if probe is not None and bound_now:
        # The optimizer's own post-hooks ran before this global one; from the next step on
        # the probe's hook (registered at binding) records each step.
        probe._after_step_hook(optimizer, args, kwargs)


# ---------------------------------------------------------------------- loss and AMP
def _capture_loss(loss: torch.Tensor) -> None:
    STATE.backward_calls += 1
    first = not STATE.probes and not STATE.early_tried and STATE.installed
    if first and loss.grad_fn is not None and _is_rank() and _probe_before_first_backward(loss):
        return
    if STATE.probes:
        for probe in STATE.probes:
            probe.on_backward_call(loss)
    elif _is_rank() and len(STATE.pending_losses) < 64:
        STATE.pending_losses.append(loss.detach())


def _scaler_before(scaler: Any, optimizer: torch.optim.Optimizer) -> core.Probe | None:
    probe, _ = _probe_for_optimizer(optimizer, create=False)
    if getattr(scaler, "_scale", None) is not None:
        scale = float(scaler._scale.item())  # already synced: the scaler just read found_inf
        if probe is not None:
            probe.scale(scale)
        elif _is_rank():  # a hand-written loop: the probe is created at this optimizer's first step
            STATE.pending_scale = scale
    return probe


def _scaler_after(probe: core.Probe, optimizer_state: dict[str, Any]) -> None:
    if sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
        probe.skipped(overflow=True)


# ---------------------------------------------------------------------- install
def _remember(refs: list[weakref.ref[Any]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            if len(refs) < MAX_TRACKED:
                _safe(refs.append, weakref.ref(self))

        return __init__

    return make


def _make_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
            _safe(_capture_loss, tensors)
        result = original(tensors, *args, **kwargs)
        if STATE.probes:
            _safe(_after_backward)
        return result

    return backward


def _after_backward() -> None:
    for probe in STATE.probes:
        probe.after_backward_call()


def capture_backward_losses() -> None:
    """Record the scalar each backward() receives as the loss of the active probes:
    zero-code mode, and integrations for frameworks that compute the loss out of the
    user's sight (the Hugging Face Trainer). Installed once; idempotent."""
    safety.patch_once(torch.autograd, "backward", _make_backward)


def _make_scaler_step(original: Callable[..., Any]) -> Callable[..., Any]:
    def _maybe_opt_step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        probe = _safe(_scaler_before, self, optimizer)
        result = original(self, optimizer, optimizer_state, *args, **kwargs)
        if probe is not None:
            _safe(_scaler_after, probe, optimizer_state)
        return result

    return _maybe_opt_step


def observe_losses() -> None:
    """The loss each backward() receives and the scale GradScaler steps with, for the
    active probes: zero-code mode, and `attach()` where the script reports no loss
    itself (a loss it reports with `probe.loss` comes first). Idempotent."""
    from torch.amp.grad_scaler import GradScaler

    capture_backward_losses()
    safety.patch_once(GradScaler, "_maybe_opt_step", _make_scaler_step)


def _after_all_reduce(tensor: Any) -> None:
    if isinstance(tensor, torch.Tensor):
        for probe in STATE.probes:
            probe.after_all_reduce(tensor)


def _make_all_reduce(original: Callable[..., Any]) -> Callable[..., Any]:
    def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(tensor, *args, **kwargs)
        # A synchronous call returns None, the reduced values in place. Traced code
        # (torch.compile) is left as it is: dynamo rewrites all_reduce itself.
        if result is None and STATE.probes and not torch.compiler.is_compiling():
            _safe(_after_all_reduce, tensor)
        return result

    return all_reduce


def observe_gradient_reduces() -> None:
    """What each synchronous `dist.all_reduce` returns, for the active probes: in a
    hand-written data-parallel loop (no DDP wrapper) the reduce of each gradient is such
    a call. Zero-code mode and `attach()` alike. Idempotent."""
    safety.patch_once(dist, "all_reduce", _make_all_reduce)


def _note_join() -> None:
    for probe in STATE.probes:
        if not probe.closed:
            probe.joined()


def install() -> None:
    if STATE.installed or not dist.is_available():
        return
    STATE.installed = True
    from torch.distributed.algorithms.join import Join
    from torch.nn.modules.loss import _Loss
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )
    from torch.utils.data import DataLoader

    def make_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = safety.call_for_caller(original, *args, **kwargs)
            _safe(_after_init, args, kwargs, original)
            return result

        return init_process_group

    def make_destroy(original: Callable[..., Any]) -> Callable[..., Any]:
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("group") is None:  # the whole job ends: the probe's group too
                _safe(_close_all)
            return safety.call_for_caller(original, *args, **kwargs)

        return destroy_process_group

    def make_ddp_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
            if _is_rank():
                # `syncdoctor experiment`'s broadcast variant acts here: before DDP's own broadcast.
                _safe(hook_points.call, hook_points.BEFORE_DDP, module)
            pre = _safe(_local_fp, module) if _is_rank() else None
            safety.call_for_caller(original, self, module, *args, **kwargs)
            _safe(_attach_ddp, self, pre)

        return __init__

    def make_join_enter(original: Callable[..., Any]) -> Callable[..., Any]:
        def __enter__(self: Any) -> Any:
            _safe(_note_join)
            return original(self)

        return __enter__

    safety.patch_once(dist, "init_process_group", make_init)
    safety.patch_once(dist, "destroy_process_group", make_destroy)
    safety.patch_once(Join, "__enter__", make_join_enter)
    safety.patch_once(DistributedDataParallel, "__init__", make_ddp_init)
    observe_losses()
    observe_gradient_reduces()
    safety.patch_once(DataLoader, "__init__", _remember(_loaders))
    safety.patch_once(_Loss, "__init__", _remember(_loss_modules))
    register_optimizer_step_pre_hook(_before_any_step)
    hooks.prepare_step_dispatch()  # before _on_any_step, which starts the probe's StepWatch
    register_optimizer_step_post_hook(_on_any_step)
    # `syncdoctor experiment`'s variants install here: after the hooks above, so theirs run after them.
    _safe(hook_points.call, hook_points.TORCH_PATCHED)

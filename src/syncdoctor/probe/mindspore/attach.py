"""Zero-code attach for MindSpore: the patches `syncdoctor run -- msrun ...` applies in
every worker right after MindSpore is imported (see boot.py), for every way people
write a training step.

Where a step can be seen from Python, whatever the style and the mode:
- every MindSpore optimizer (`nn.Optimizer`) counts its updates in its own
  `global_step` parameter, inside its construct, even when that is compiled. So after
  each *outermost* call that Python makes into MindSpore -- a Cell's `__call__`
  (`TrainOneStepCell`, a custom train cell, the optimizer itself in PyNative) or a
  jitted function (`_JitExecutor.__call__`) -- the probe reads `global_step`; if it
  moved, a step ended. Calls nested inside another are not looked at (in GRAPH mode
  and under `@ms.jit` they are compiled and Python never sees them).
- `Model.train` gets the callback (probe/mindspore/probe.py) and the patches stand down.
- `nn.Optimizer.__init__`: the optimizer is remembered and the parameters it updates
  are fingerprinted there, before any update (an unseeded init shows at step 0).
- the dataset iterator's `__next__`: batches and samples per step (micro-steps are
  the batches drawn from the iterator that fed the step, so an evaluation loop on
  rank 0 alone does not shift the counters).
- the loss: the step call's output (a train cell's or a jitted step's first scalar),
  else the scalars that outermost calls returned since the previous step (the loss
  cell's output inside `value_and_grad` in PyNative).
- `DistributedGradReducer.__init__`: every reducer built, with the settings that
  decide the reduce (mean, degree, group and its size), whatever runs it later; its
  calls (PyNative): its input is this rank's local gradients, its output the reduced
  ones, for the gradient norms at check steps.

One line at the first step says which style was recognised; a rank that draws
batches but never steps an optimizer is told once that the probe could not attach
and the line that fixes it. Nothing here may change what training does: every hook
calls the original and does its own work under `_safe`.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from syncdoctor.probe.core import safety
from syncdoctor.probe.core.fingerprint import array_fingerprint
from syncdoctor.probe.mindspore.watch import (
    W,
    find_loss,
    global_step,
    pick_reducer,
    reducer_settings,
    scaled_step_outputs,
    stages,
    take_batches,
    take_init,
    to_float,
)
from syncdoctor.settings import CHECK_EVERY_ENV, DEFAULT_CHECK_EVERY, ON_MISMATCH_ENV, RUN_DIR_ENV

NO_STEP_AFTER_BATCHES = 20  # batches drawn with no update seen: say the probe could not attach
FIX_LINE = (
    "add `probe = syncdoctor.probe.mindspore.MindSporeProbe(net, optimizer)` after building the "
    "optimizer and `probe.after_step(loss=loss)` after each update"
)


def _stand_down(exc: BaseException) -> None:
    """A patch failed: the probe stands down on this rank; the patches call the originals only."""
    W.stood_down = True
    safety.stand_down(exc, [W.probe] if W.probe is not None else [])


_safe = safety.guard(on_error=_stand_down)


def _scalar(value: Any) -> Any:
    """The float scalar tensor that is `value` or its first element (a loss), or None."""
    try:
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        shape = getattr(value, "shape", None)
        if shape is not None and int(np.prod(shape)) == 1 and "float" in str(getattr(value, "dtype", "")).lower():
            return value
    except Exception:
        pass
    return None


# --------------------------------------------------------------------------- the public one-liners
def report(ids: Any = None, loss: Any = None, overflow: bool | None = None, loss_scale: float | None = None) -> None:
    """Optional, in a script run zero-code: sample ids, the loss, the loss scale or an
    overflow for the step in progress (as the torch probe's probe.batch/loss/scale).
    Does nothing where the probe is not installed."""
    if not W.installed:
        return
    for key, value in (("ids", ids), ("loss", loss), ("overflow", overflow), ("loss_scale", loss_scale)):
        if value is not None:
            if key == "ids" and "ids" in W.reported:
                W.reported["ids"] = [*W.reported["ids"], value]
            else:
                W.reported[key] = [value] if key == "ids" else value


def skipped(loss: Any = None, loss_scale: float | None = None) -> None:
    """Optional: an iteration ended without an update (a loss-scale overflow skip)."""

    def run() -> None:
        if W.optimizer is None:
            return
        report(loss=loss, overflow=True, loss_scale=loss_scale)
        _record(W.optimizer, None, None, None)  # no update: the optimizer's counter stays where it was

    _safe(run)


# --------------------------------------------------------------------------- step detection
def _optimizer_in(cell: Any) -> Any:
    """The tracked optimizer a cell is or contains (cached per cell)."""
    key = id(cell)
    if key in W.cell_opt:
        return W.cell_opt[key]
    found = None
    tracked = {id(ref()): ref() for ref, _ in W.optimizers if ref() is not None}
    if tracked:
        try:
            for _, sub in cell.cells_and_names():
                if id(sub) in tracked:
                    found = sub
                    break
        except Exception:
            pass
    W.cell_opt[key] = found
    try:
        weakref.finalize(cell, W.cell_opt.pop, key, None)
    except TypeError:
        pass
    return found


def _after_outer_call(kind: str, target: Any, args: tuple[Any, ...], out: Any) -> None:
    if W.in_model_train:
        return
    if kind == "cell":
        optimizer = _optimizer_in(target)
        candidates = [optimizer] if optimizer is not None else []
        if optimizer is None and len(W.outer_cells) < 16:
            W.outer_cells.append(weakref.ref(target))
    else:  # a jitted function: any optimizer may have run inside it
        optimizer = None
        candidates = [ref() for ref, _ in W.optimizers]
    for opt in candidates:
        if opt is None or (W.optimizer is not None and opt is not W.optimizer):
            continue
        now = global_step(opt)
        if now is not None and now != W.last_global:
            _record(opt, kind, now, (target, args, out))
            return
    if optimizer is not None and optimizer is not target:
        # A train cell ran and its optimizer did not move: the update was skipped
        # (TrainOneStepWithLossScaleCell on overflow).
        _record(optimizer, kind, None, (target, args, out), overflow=True)
        return
    loss = _scalar(out)
    if loss is not None:
        W.losses = [*W.losses[-63:], loss]
        if kind == "cell" and W.loss_cell is None:
            W.loss_cell = target


def _style(opt: Any, kind: str | None, call: Any) -> str:
    import mindspore as ms

    mode = "GRAPH" if ms.get_context("mode") == ms.GRAPH_MODE else "PyNative"
    if kind is None:
        return f"reported steps ({mode})"
    target = call[0]
    if kind == "jit":
        name = getattr(target, "fn", None)
        name = getattr(name, "__qualname__", None) or getattr(name, "__name__", "?")
        return f"a jitted step function `{name}` ({mode})"
    if target is opt:
        return f"functional: value_and_grad + optimizer(grads) ({type(opt).__name__}, {mode})"
    return f"train cell {type(target).__name__} ({mode})"


def ms_graph_mode() -> bool:
    import mindspore as ms

    return bool(ms.get_context("mode") == ms.GRAPH_MODE)


def _loss_how(opt: Any, kind: str | None, call: Any) -> str | None:
    """How the loss is read in this style (None: it is not)."""
    if "loss" in W.reported:
        return "reported with attach.report(loss=...)"
    if call is not None and call[0] is not opt and _scalar(call[2]) is not None:
        return "the step's output (its first scalar)" if kind == "jit" else "the train cell's output"
    if W.losses:
        return "the loss cell's output inside value_and_grad (PyNative)"
    return None


def _roots_owning(param: Any) -> list[Any]:
    """The outermost Cells that hold `param`: among the cells Python called at the
    outermost level, else found once through the garbage collector's referrers
    (parameter -> the cell's parameter dict -> its attribute dict -> the cell -> ...)."""
    from mindspore import nn

    for ref in W.outer_cells:
        cell = ref()
        if cell is not None and not isinstance(cell, nn.Optimizer):
            try:
                if any(p is param for p in cell.get_parameters()):
                    return [cell]
            except Exception:
                pass

    def cells_referring(obj: Any) -> list[Any]:
        found, dicts = [], [obj]
        for _ in range(3):  # up to two dict levels between an object and the cell holding it
            nxt = []
            for d in dicts:
                for ref in gc.get_referrers(d):
                    kind = type(ref)  # not isinstance: a dead weak proxy raises on __class__
                    if issubclass(kind, nn.Cell):
                        found.append(ref)
                    elif issubclass(kind, dict):  # a cell's parameter dicts are OrderedDicts
                        nxt.append(ref)
            dicts = nxt
            if not dicts:
                break
        return found

    frontier, roots = cells_referring(param), []
    seen: set[int] = set()
    while frontier and len(seen) < 200:
        cell = frontier.pop()
        if id(cell) in seen:
            continue
        seen.add(id(cell))
        parents = [c for c in cells_referring(cell) if c is not cell and not isinstance(c, nn.Optimizer)]
        if parents:
            frontier.extend(parents)
        elif not isinstance(cell, nn.Optimizer):
            roots.append(cell)
    return roots


def _start(opt: Any, kind: str | None, call: Any) -> None:
    from syncdoctor.probe.mindspore.probe import MindSporeProbe

    W.optimizer = opt
    W.last_global = 0
    init_fp = next((fp for ref, fp in W.optimizers if ref() is opt), None)
    params = list(opt.parameters)
    roots = []
    if call is not None and call[0] is not opt and kind == "cell":
        roots = [call[0]]
    if not roots and params:
        roots = _roots_owning(params[0])
    mode_cells: list[Any] = []
    seen: set[int] = set()
    for root in roots:
        for _, c in root.cells_and_names():
            if id(c) not in seen and not _is_optimizer(c):
                seen.add(id(c))
                mode_cells.append(c)
    loss_fn = None
    for root in roots:
        loss_fn = loss_fn or find_loss(root)
    loss_fn = loss_fn or W.loss_cell or _only_loss_cell()
    W.style = _style(opt, kind, call)
    reducer = pick_reducer(opt, roots)
    graph = ms_graph_mode()
    compiled = None
    if kind == "jit":
        compiled = "the step is compiled whole (@ms.jit): Python never sees its gradients"
    elif graph:
        compiled = "the train cell runs compiled (GRAPH mode): Python never sees its gradients"
    grads = W.grads if not (call is not None and call[0] is opt and call[1]) else call[1][0]
    scaler = W.scaler() if W.scaler else None
    seen_stages = stages(
        compiled=compiled,
        data="the batches drawn from the dataset iterator that fed the step" if W.last_iter is not None else None,
        loss=_loss_how(opt, kind, call),
        reducer=reducer_settings(reducer),
        grads_local=W.grads_local is not None,
        grads_reduced=grads is not None,
        loss_scale=(
            f"{type(scaler).__name__}.scale_value at every step"
            if scaler is not None
            else "the train cell's (loss, overflow, scale) output"
            if call is not None and hasattr(call[0], "scale_sense")
            else None
        ),
    )
    every = os.environ.get(CHECK_EVERY_ENV)
    W.probe = MindSporeProbe(
        None,
        opt,
        os.environ.get(RUN_DIR_ENV),
        loss_fn=loss_fn,
        dataset=W.dataset() if W.dataset else None,
        grad_reducer=reducer,
        loss_scaler=W.scaler() if W.scaler else None,
        check_every=int(every) if every else DEFAULT_CHECK_EVERY,
        on_mismatch=os.environ.get(ON_MISMATCH_ENV) or "warn",
        params=params,
        mode_cells=mode_cells,
        init_param_fp=init_fp,
        auto=True,
        extra={"style": W.style, "stages": seen_stages},
    )
    rank = getattr(W.probe, "rank", 0)
    print(
        f"syncdoctor: probe attached on rank {rank} to {W.style}; records in {os.environ.get(RUN_DIR_ENV)}/records",
        file=sys.stderr,
        flush=True,
    )
    atexit.register(_close)


def _only_loss_cell() -> Any:
    """The one loss Cell in the process, if there is exactly one (a step compiled whole
    under @ms.jit shows Python nothing of it)."""
    from mindspore import nn

    # type(), not isinstance: the collector also hands out weak proxies, dead ones included.
    found = [o for o in gc.get_objects() if issubclass(type(o), nn.LossBase)]
    return found[0] if len(found) == 1 else None


def _is_optimizer(cell: Any) -> bool:
    from mindspore import nn

    return isinstance(cell, nn.Optimizer)


def _record(opt: Any, kind: str | None, now: int | None, call: Any, overflow: bool | None = None) -> None:
    if W.probe is None:
        if W.start_failed or (W.optimizer is not None and opt is not W.optimizer):
            return
        W.start_failed = True  # until _start returns: a probe that cannot start is not retried every step
        try:
            _start(opt, kind, call)
        except Exception as exc:
            print(
                f"syncdoctor: the probe could not attach on this rank ({type(exc).__name__}: {exc}); {FIX_LINE}",
                file=sys.stderr,
                flush=True,
            )
            return
        W.start_failed = False
    elif opt is not W.optimizer:
        return  # a second optimizer (a GAN's other half): the first one is watched
    probe = W.probe
    rep, W.reported = W.reported, {}
    loss = rep.get("loss")
    if loss is None and call is not None and call[0] is not opt:
        loss = _scalar(call[2])
    if loss is None and W.losses:
        values = [float(np.asarray(v.asnumpy()).reshape(-1)[0]) for v in W.losses]
        loss = sum(values) / len(values)
    W.losses = []
    micro, samples, data_fp = take_batches()
    if samples is None and call is not None and call[0] is not opt and call[1]:
        shape = getattr(call[1][0], "shape", None)
        samples = int(shape[0]) if shape else None
    W.batches_without_step = 0
    if now is not None:
        W.last_global = now
    grads, grads_local = W.grads, W.grads_local
    if call is not None and call[0] is opt and call[1]:
        grads = call[1][0]  # optimizer(grads): what the update used
    W.grads = W.grads_local = None
    scale = rep.get("loss_scale")
    if scale is None and call is not None and hasattr(call[0], "scale_sense"):  # TrainOneStepWithLossScaleCell
        scaled = scaled_step_outputs(call[2])
        if scaled[1] is not None or scaled[0] is not None:
            overflow, scale = scaled
    if scale is None and W.scaler is not None and W.scaler() is not None:
        scale = to_float(W.scaler().scale_value)
    ids = rep.get("ids")
    probe.after_step(
        loss=loss,
        grads=grads,
        grads_local=grads_local,
        batch_ids=ids,
        micro=micro,
        samples=samples,
        overflow=rep.get("overflow", overflow),
        loss_scale=scale,
        opt_steps=now,
        data_fp=data_fp,
    )


def _close() -> None:
    if W.probe is not None:
        # An uncaught exception was printed (PyErr_Print sets sys.last_value) before atexit runs.
        error = getattr(sys, "last_value", None)
        if error is not None:
            _safe(W.probe.close, "exception", f"{type(error).__name__}: {error}"[:2000])
        else:
            _safe(W.probe.close)


def _no_step_yet(at_exit: bool = False) -> None:
    if W.told_no_step or W.probe is not None or W.model_train_seen or not W.batches_without_step:
        return
    W.told_no_step = True
    print(
        f"syncdoctor: the probe could not attach on this rank: {W.batches_without_step} batches drawn and no "
        f"MindSpore optimizer update seen{' by the end' if at_exit else ''} (an optimizer that is not a "
        f"mindspore.nn.Optimizer, or an update outside MindSpore); {FIX_LINE}",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------- the patches
def _class_in(module: str, name: str) -> Any:
    """`module.name`, or None where this MindSpore version has no such thing."""
    try:
        return getattr(importlib.import_module(module), name, None)
    except Exception:
        return None


def _then(hook: Callable[[Any, Any], None]) -> Callable[[Any], Any]:
    """A wrapper maker: the original runs, then `hook(self, its result)` under `_safe`."""

    def make(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, *args, **kwargs)
            if not W.stood_down:
                _safe(hook, self, out)
            return out

        return wrapper

    return make


def _outer_call(kind: str, inner: Callable[[Any, tuple[Any, ...], Any], None] | None = None) -> Callable[[Any], Any]:
    """A wrapper maker for a call into MindSpore (a Cell's or a jitted function's): the
    initial fingerprint is taken before the first call after an optimizer was built;
    `inner` sees every call, nested ones included; the outermost call may end a step."""

    def make(original: Any) -> Any:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            if W.stood_down:
                return original(self, *args, **kwargs)
            if W.need_init and not W.depth:
                _safe(take_init)
            W.depth += 1
            try:
                out = original(self, *args, **kwargs)
            finally:
                W.depth -= 1
            if inner is not None:
                _safe(inner, self, args, out)
            if W.depth == 0:
                _safe(_after_outer_call, kind, self, args, out)
            return out

        return __call__

    return make


def _cell_call_watcher(nn: Any) -> Callable[[Any, tuple[Any, ...], Any], None]:
    """What every Cell call is looked at for (PyNative): the reducer's input and output,
    and an optimizer called inside a train cell (the gradients it was given)."""
    reducer_cls = getattr(nn, "DistributedGradReducer", None)
    optimizer_cls = nn.Optimizer

    def saw(cell: Any, args: tuple[Any, ...], out: Any) -> None:
        if reducer_cls is not None and isinstance(cell, reducer_cls):
            _saw_reducer(cell, args, out)
        elif W.depth and isinstance(cell, optimizer_cls) and args:
            W.grads = args[0]  # optimizer(grads) inside a train cell run op by op (PyNative)

    return saw


def _saw_reducer(reducer: Any, args: tuple[Any, ...], out: Any) -> None:
    if W.reducer is None:
        W.reducer = weakref.ref(reducer)
    probe = W.probe
    next_step = (probe.step + 1) if probe is not None else 1
    if (probe is None or probe.is_check_step(next_step)) and args:
        W.grads_local, W.grads = args[0], out  # this rank's own gradients, and the reduced ones


_REDUCER_ARGS = ("mean", "degree", "fusion_type", "group")  # DistributedGradReducer's, after `parameters`


def _reducer_init(original: Any) -> Any:
    """DistributedGradReducer.__init__, then its settings recorded: the reducer may only
    ever run compiled (GRAPH mode, @ms.jit), where no call of it reaches Python."""

    def __init__(self: Any, parameters: Any, *args: Any, **kwargs: Any) -> None:
        original(self, parameters, *args, **kwargs)
        if not W.stood_down:
            _safe(_saw_reducer_built, self, parameters, {**dict(zip(_REDUCER_ARGS, args, strict=False)), **kwargs})

    return __init__


def _saw_reducer_built(reducer: Any, parameters: Any, given: dict[str, Any]) -> None:
    from mindspore.communication import GlobalComm, get_group_size

    group = given.get("group") or GlobalComm.WORLD_COMM_GROUP
    try:
        size: int | None = int(get_group_size(group))
    except Exception:
        size = None
    degree = given.get("degree")
    settings = {
        "mean": bool(reducer.mean) if reducer.mean is not None else None,
        # Who decided the mean: the argument, or (None) the parallel context's gradients_mean.
        "mean_from": "context" if given.get("mean") is None else "argument",
        "degree": int(degree) if isinstance(degree, int) else size,
        "group": str(group),
        "group_size": size,
        "n_params": len(parameters),
    }
    W.reducers = [
        *[r for r in W.reducers if r[0]() is not None][-15:],
        (weakref.ref(reducer), settings, frozenset(id(p) for p in parameters)),
    ]


def _saw_optimizer(opt: Any, _: Any = None) -> None:
    if any(ref() is opt for ref, _fp in W.optimizers):
        return
    W.optimizers.append((weakref.ref(opt), None))
    W.cell_opt.clear()  # cells seen before may contain this one
    W.need_init = True


def _saw_batch(iterator: Any, batch: Any) -> None:
    first: Any = next(iter(batch.values())) if isinstance(batch, dict) else batch[0] if batch else None
    n = None
    shape = getattr(first, "shape", None)
    if shape:
        n = int(shape[0])
    key = id(iterator)
    counts = W.iter_counts.setdefault(key, [0, 0])
    counts[0] += 1
    counts[1] += n or 0
    W.last_iter = key
    if W.dataset is None:
        dataset = getattr(iterator, "_Iterator__ori_dataset", None) or getattr(iterator, "dataset", None)
        if dataset is not None:
            try:
                W.dataset = weakref.ref(dataset)
            except TypeError:
                pass
    probe = W.probe
    if probe is None or probe.is_check_step(probe.step + 1):
        arr = first.asnumpy() if hasattr(first, "asnumpy") else np.asarray(first)
        W.data_fps.append(array_fingerprint(arr))
    if W.probe is None and not W.in_model_train:
        W.batches_without_step += 1
        if W.batches_without_step >= NO_STEP_AFTER_BATCHES:
            _no_step_yet()


def _saw_scaler(scaler: Any, _: Any = None) -> None:
    W.scaler = weakref.ref(scaler)


def _model_train(original: Any) -> Any:
    """Model.train with the recording callback added (unless the script added it)."""
    from syncdoctor.probe.mindspore import probe as msprobe

    def train(self: Any, epoch: int, train_dataset: Any, callbacks: Any = None, *args: Any, **kwargs: Any) -> Any:
        try:
            cbs = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
            if not any(isinstance(c, msprobe.SyncDoctorCallback) for c in cbs):
                every = os.environ.get(CHECK_EVERY_ENV)
                cbs.append(
                    msprobe.SyncDoctorCallback(
                        os.environ.get(RUN_DIR_ENV), check_every=int(every) if every else DEFAULT_CHECK_EVERY
                    )
                )
            callbacks = cbs
        except Exception:
            pass
        W.in_model_train = W.model_train_seen = True  # the callback records; the generic hooks stand down
        try:
            return original(self, epoch, train_dataset, callbacks, *args, **kwargs)
        finally:
            W.in_model_train = False

    return train


def install() -> bool:
    """Apply every patch (idempotent). False in msrun's scheduler, which trains nothing."""
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return False
    if W.installed:
        return True
    from mindspore import nn

    safety.patch_once(_class_in("mindspore.train.model", "Model"), "train", _model_train)
    safety.patch_once(nn.Cell, "__call__", _outer_call("cell", _cell_call_watcher(nn)))
    safety.patch_once(_class_in("mindspore.graph.api", "_JitExecutor"), "__call__", _outer_call("jit"))
    safety.patch_once(nn.Optimizer, "__init__", _then(_saw_optimizer))
    safety.patch_once(getattr(nn, "DistributedGradReducer", None), "__init__", _reducer_init)
    safety.patch_once(_class_in("mindspore.dataset.engine.iterators", "Iterator"), "__next__", _then(_saw_batch))
    from syncdoctor.probe.core import process

    # mindspore.amp is imported after mindspore.train by the package: patch it when it is.
    process.when_imported(
        "mindspore.amp",
        lambda: _safe(
            safety.patch_once, _class_in("mindspore.amp", "DynamicLossScaler"), "__init__", _then(_saw_scaler)
        ),
    )
    W.installed = True
    atexit.register(lambda: _safe(_no_step_yet, True))
    return True


# --------------------------------------------------------------------------- entry points
def install_autoattach(run_dir: str | os.PathLike[str] | None = None, check_every: int | None = None) -> bool:
    """Attach to every training style without code changes: Model.train, train cells,
    value_and_grad + optimizer(grads), jitted steps. False where MindSpore is missing."""
    if run_dir is not None:
        os.environ.setdefault(RUN_DIR_ENV, str(run_dir))
    if check_every is not None:
        os.environ.setdefault(CHECK_EVERY_ENV, str(check_every))
    try:
        return install()
    except Exception as exc:
        print(f"syncdoctor: MindSpore probe not installed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False


def install_lazy_autoattach() -> None:
    """For a sitecustomize: attach when (and only if) the process imports MindSpore."""
    from syncdoctor.probe.core import process

    process.when_imported("mindspore.train.model", install_autoattach)

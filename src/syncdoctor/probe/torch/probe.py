"""The torch probe: per-rank, per-step records and the live cross-rank check.

Cost model (shared facts): one pass over the parameter bytes is the floor of an
exact check. Every step records only what training already computed (loss, lr,
counters), copied into the record writer's memory-mapped tail. Every `check_every`
steps the parameters, the buffers and the input are fingerprinted and posted for the
cross-rank check, which never waits on other ranks (check.py). The rest of the state
(reduced gradients, optimizer state) and the diagnostics (gradient norms, the
pre-reduce norm, the fp16 sample) follow every `detail_every` steps, a multiple of K
of at least DETAIL_EVERY (every other check at the default K). State that parts
without the parameters parting at once makes them part at the next update, which
reads it: the exact check sees it a step later.

Safety: every hook body runs under `_guard`, which turns any probe exception into a
recorded event and disables the probe; only `on_mismatch="raise"` raises, by choice.
"""

from __future__ import annotations

import atexit
import gc
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from syncdoctor import settings
from syncdoctor.probe.core import hook_points, precision, safety
from syncdoctor.probe.core.compare import config_fingerprint, groups_fingerprint
from syncdoctor.probe.core.evidence import LAST_LOSSES
from syncdoctor.probe.core.fingerprint import combine, to_int64
from syncdoctor.probe.core.state import STATE
from syncdoctor.probe.torch.canary import Canary, CanaryUnavailable
from syncdoctor.probe.torch.check import CrossRankCheck
from syncdoctor.probe.torch.fingerprint import ViewCache, fingerprints, ids_fingerprint
from syncdoctor.probe.torch.hooks import ForwardWatch, GradWatch, StepWatch
from syncdoctor.probe.torch.mesh import layout_of, local_shard
from syncdoctor.probe.torch.snapshot import build_snapshot
from syncdoctor.records import contract
from syncdoctor.records.constants import MAX_IDS, SCHEMA_VERSION
from syncdoctor.records.writer import RecordWriter
from syncdoctor.settings import DEFAULT_CHECK_EVERY, DEFAULT_RUN_DIR, SyncMismatchError

log = logging.getLogger("syncdoctor")
__all__ = ["DEFAULT_CHECK_EVERY", "DEFAULT_RUN_DIR", "NullProbe", "Probe", "SyncMismatchError", "attach"]

DETAIL_EVERY = 100  # the full state and the diagnostics: at least this many steps apart
CLOSE_WAIT_S = 5.0  # at close, the last check's wait: the end of a run must not hang on it
MAX_SYNCS = 64  # backward calls of one update whose sync flag is kept


def _ddp_class() -> type[torch.nn.parallel.DistributedDataParallel]:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def _reduced_by(ddp: Any) -> set[int]:
    """The parameters a DDP wrapper's reducer averages, and the ones it was told to
    leave alone (the script reduces those itself, by design)."""
    ignored: set[str] = getattr(ddp, "parameters_to_ignore", None) or set()
    return {id(p) for n, p in ddp.module.named_parameters() if p.requires_grad or n in ignored}


def _outside_every_reducer(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, Any]]:
    """The parameters `optimizer` updates that are not in the wrapped `module` and that
    no live DDP wrapper averages (learnable loss weights, a temperature, a criterion's
    parameters): each rank applies its own gradient to them. Named by their place in
    the optimizer; a scan of live objects, once, only where such parameters exist."""
    inside = {id(p) for p in module.parameters()}
    outside = [
        (f"optimizer group {g} parameter {i} {tuple(p.shape)}", p)
        for g, group in enumerate(optimizer.param_groups)
        for i, p in enumerate(group["params"])
        if id(p) not in inside
    ]
    if not outside:
        return []
    ddp = _ddp_class()
    covered = set().union(*(_reduced_by(o) for o in gc.get_objects() if issubclass(type(o), ddp)))
    return [(name, p) for name, p in outside if id(p) not in covered]


def _grad_outside(module: torch.nn.Module, reduced: set[int]) -> bool:
    """Whether a parameter of `module` holds a gradient that is not in `reduced`: one
    walk over the modules' own dicts, at every check (named_parameters() builds a name
    for every parameter, several times the cost; the names are read only on a hit)."""
    seen: set[int] = set()
    stack = [module]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        for p in m._parameters.values():
            if p is not None and p.grad is not None and id(p) not in reduced:
                return True
        stack.extend(m._modules.values())  # type: ignore[arg-type]  # None entries: skipped above
    return False


def _unwatched(modules: list[torch.nn.Module], module_ids: set[int], watched: set[int]) -> bool:
    """Whether the modules the probe began with hold a trainable parameter whose id is not
    in `watched`, or a child module they did not hold (a layer replaced: its parameters
    are new). A loop over the modules' own dicts: names are built only on a hit."""
    for m in modules:
        for p in m._parameters.values():
            if p is not None and p.requires_grad and id(p) not in watched:
                return True
        for c in m._modules.values():
            if c is not None and id(c) not in module_ids:
                return True
    return False


def _ddp_holding(module: torch.nn.Module) -> Any:
    """The live DDP wrapper of `module`, if one holds it (a scan of live objects, once
    per probe, only where DDP is in use)."""
    if "torch.nn.parallel.distributed" not in sys.modules or not (dist.is_available() and dist.is_initialized()):
        return None
    ddp = _ddp_class()
    # type(), not isinstance(): see auto._module_holding (a deprecated object warns on __class__).
    return next((o for o in gc.get_objects() if issubclass(type(o), ddp) and o.module is module), None)


class Probe:
    """Watches one rank's model and optimizer. Create it with `syncdoctor.attach`."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        loss_fn: Any = None,
        loader: Any = None,
        global_batch: int | None = None,
        check_every: int | None = None,
        on_mismatch: str | None = None,
        tensor_norms_every: int | None = None,
        activations_every: int | None = None,
        activation_stride: int = 2,
        check_timeout_s: float | None = None,
        log_path: str | os.PathLike[str] | None = None,
        init_param_fp_local: int | None = None,
        auto: bool = False,
        baseline: dict[str, Any] | None = None,
        canary: bool | None = None,
    ) -> None:
        on_mismatch = settings.on_mismatch_from_env(on_mismatch)
        self.run_dir = Path(run_dir or os.environ.get(settings.RUN_DIR_ENV) or DEFAULT_RUN_DIR)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else int(os.environ.get("RANK", 0))
        self.world_size = dist.get_world_size() if self.distributed else int(os.environ.get("WORLD_SIZE", 1))
        self.model = model
        self.module: torch.nn.Module = model.module if isinstance(model, _ddp_class()) else model
        # The DDP wrapper that calls the module, also where the user attached the inner
        # module (a Trainer callback is handed the unwrapped model): the forward watch
        # runs at its call, with no global hook (probe/torch/hooks.py).
        self._wrapper = model if model is not self.module else _ddp_holding(self.module)
        # What DDP's reducer averages: the parameters that required a gradient when the
        # wrapper was built (it is built then, once), less the ones it was told to ignore.
        # A gradient on any other parameter is never averaged (frozen then unfrozen, a
        # layer replaced after the wrap). None without a DDP wrapper.
        self._reduced_ids = self._guard(_reduced_by, self._wrapper) if self._wrapper is not None else None
        self._outside_reducer: list[tuple[str, Any]] = []  # set when the optimizer is bound
        self.optimizer: torch.optim.Optimizer | None = None
        self.loss_fn, self.loader, self.global_batch = loss_fn, loader, global_batch
        self.baseline = baseline  # the single-card recipe (lr, batch_size), for the doctor
        self.check_every = settings.check_every_from_env(check_every)
        self.stop_after = settings.stop_after_from_env()
        self._updates_seen = 0
        self.detail_every = self.check_every * math.ceil(DETAIL_EVERY / self.check_every)
        self.tensor_norms_every = tensor_norms_every or self.detail_every * 5
        self.activations_every = activations_every
        self.activation_stride = max(1, activation_stride)
        self._check_timeout_s = check_timeout_s
        self.on_mismatch = on_mismatch
        self.log_path = Path(log_path) if log_path else None
        self.auto = auto  # zero-code: the loss is what reaches backward(), the scale GradScaler's
        self.init_param_fp_local = init_param_fp_local
        self.writer = RecordWriter(self.run_dir, self.rank, tail=True)
        self.disabled = False
        self.closed = False
        self._joined = False  # entered a Join context (uneven inputs by design)
        self._handles: list[Any] = []
        # counters
        self.step = 0  # iterations ended: optimizer steps plus reported skips
        self.opt_steps = 0
        self.backward = 0
        self._backward_at_last_step = 0
        # The sync schedule, per backward() call since the last update: "s" where DDP
        # all-reduced its gradients, "n" inside no_sync (DDP wrappers only; bounded).
        # Which micro-steps synchronise must be the same on every rank: a rank that
        # synchronises where another does not pairs its all-reduce with the wrong one.
        self._syncs = ""
        # no_sync backward passes whose gradients were thrown away (zero_grad) before
        # any update read them: not counted as micro-steps of the next update.
        self._discarded = 0
        # At detailed steps: the gradients' fingerprint right after the update's last
        # synchronised backward() returned (DDP's all-reduce done, no user code after it
        # yet), beside grad_fp at the update: tells the reduce from what changed the
        # gradients between it and the update (clipping, unscaling, a rank branch).
        self._reduced_grad_fp: int | None = None
        # The same for a hand-written loop (no DDP wrapper), where the reduce is the
        # user's own `dist.all_reduce` of each gradient: each result's fingerprint as the
        # call returned, by (data pointer, size), matched to the gradients at the update.
        # The tensor is held until then, so that its memory is not reused under that key.
        self._hand_reduced: dict[tuple[int, int], tuple[torch.Tensor, int]] = {}
        # At measured steps: each gradient and its in-place version counter as that same
        # backward() returned. At the update, the writes into them since (clip_grad_norm_,
        # GradScaler's unscale_ and manual scaling write in place; a new tensor counts one)
        # must be the same on every rank: code under a rank branch is not.
        self._grads_after_reduce: list[tuple[torch.Tensor | None, int]] | None = None
        self._last_measured_step = 0
        # The first parameter's version counter after the last step: torch bumps it at
        # every in-place change, so at close it tells whether code after the last step
        # (a checkpoint loaded, EMA weights written back) changed the parameters.
        self._version_after_step = 0
        # The parameters that held no gradient as each update read them, summed over
        # the updates so far: (how many, a fingerprint of which, the last one named).
        self._grads_missing = 0
        self._grads_missing_fp = 0
        self._grads_missing_first: str | None = None
        # Updates of a DDP model none of whose backward() calls since the previous update
        # synchronised (all inside no_sync): the optimizer read this rank's own, never
        # averaged gradients. How many so far, and the first one's step.
        self._unsynced_updates = 0
        self._unsynced_first = 0
        # The same for a hand-written loop (no DDP wrapper): whether a synchronous
        # `dist.all_reduce` of a parameter's gradient returned since the previous update,
        # and whether one ever did before an update (the loop has shown that it reduces).
        # Only then does an update with no such call count: a job that never calls
        # dist.all_reduce on a gradient (FSDP2, its own comm library, a flat buffer, an
        # all_reduce bound before the patch) counts none.
        self._grad_reduced = False
        self._reduces_grads = False
        # what the current iteration reported
        self._losses: list[torch.Tensor | float] = []  # through probe.loss()
        self._auto_losses: list[torch.Tensor] = []  # scalars that reached backward()
        self._data_fps: list[int] = []  # through probe.batch()
        self._samples = 0
        self._ids: list[int] = []  # the reported sample ids, up to MAX_IDS per step
        self._input_fps: list[int] = []  # the model's input, when the script reports no batch
        self._input_samples = 0
        self._loss_scale: float | None = None
        self._local_norms: dict[int, torch.Tensor] = {}  # per-parameter local (pre-reduce) grad norms
        self._local_norm_handles: list[Any] = []
        self._buffer_fp: int | None = None
        self._acts: list[dict[str, Any]] = []
        self._activation_names: dict[int, str] = {}  # id(child) -> its name in the records
        self.last_tensor_fps: list[int] = []  # per parameter, at the last check: to name the first that differs
        self._hparams_cache: tuple[Any, int] | None = None  # (the hyperparameters' key, their fingerprint)
        self._recent_losses: list[float | None] = [None] * LAST_LOSSES  # by step % LAST_LOSSES
        self.last_grad_norm: float | None = None
        self._measuring = True  # the first iteration is measured in full: step 1 is a check step
        self._detailed = True
        self._views = ViewCache()
        self._buffers: list[torch.Tensor] | None = None
        self.checker: CrossRankCheck | None = None
        self._named_params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self._params = [p for _, p in self._named_params]
        self._param_ids = {id(p) for p in self._params}
        # Every parameter object the module held when the probe began (frozen ones too),
        # and, from the first check on, the storage each watched one held: the live
        # bindings (_rebound). The watched ones are pinned by _params, so their ids stay theirs.
        self._bound_ids = {id(p) for p in self.module.parameters()}
        self._storages: list[int] | None = None
        self._swaps = 0  # watched parameters whose storage was replaced, summed over the checks
        self._rebound_first: str | None = None
        self._modules = list(self.module.modules())
        self._module_ids = {id(m) for m in self._modules}
        # The initial weights, taken now: at DDP construction (after its broadcast), at
        # attach, or before the first update of a loop without DDP (auto.py binds there).
        # Taken at the first step's end it would already hold the first update, and a
        # hyperparameter differing on one rank would look like an unseeded init.
        # `syncdoctor experiment`'s broadcast variant puts rank 0's weights in place here.
        hook_points.call(hook_points.BEFORE_WATCH, self.module)
        self.layout = self._guard(layout_of, self._params, self.rank)
        if canary is None:
            canary = os.environ.get(settings.CANARY_ENV, "1") != "0"
        self._canary = Canary(self.module) if canary else None  # at detailed checks
        init_fps = self._guard(lambda: fingerprints(p for _, p in self._named_params)) or []
        self._init_param_fp = combine(init_fps)
        self._init_class_fps = self._per_class(init_fps)
        self._init_before_update = optimizer is None or not optimizer.state
        # Bound later (at the first optimizer step, zero-code): the weights are taken again
        # there, before its update, where state loaded after the wrap has landed.
        self._init_taken_at_bind = optimizer is not None
        self.init_params_changed = False
        self.opt_state_replicated = True
        self._guard(self._install_model_hooks)
        # A model rebuilt in the same process (checkpoint, rebuild, load, resume) is the
        # same replica's next segment, not a second model: the probes of the same layout
        # alive now, with their update counts, decide it at this probe's first optimizer
        # (_take_over_from_rebuilt).
        self.segment = 1
        self._layout_key = tuple((n, tuple(p.shape)) for n, p in self._named_params)
        self._peers_at_birth = {id(q): q.opt_steps for q in STATE.probes if q._layout_key == self._layout_key}
        if optimizer is not None:
            self.bind_optimizer(optimizer)
        STATE.probes.append(self)
        atexit.register(self._close_at_exit)

    # ------------------------------------------------------------------ setup
    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Start recording steps of `optimizer` (called by attach, or on the first step
        seen when attached without code changes)."""
        if self.optimizer is not None:
            return
        self.optimizer = optimizer
        self._guard(self._start, optimizer)

    def owns(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether `optimizer` updates this probe's parameters."""
        return any(id(p) in self._param_ids for g in optimizer.param_groups for p in g["params"])

    def _take_over_from_rebuilt(self) -> None:
        """If this probe's model replaces one the user rebuilt (a probe of the same layout
        that updated before this probe was made and not since: its optimizer is no
        longer stepped), that probe's segment ends here and this one goes on counting
        from it: one replica, one record, never a second model. Two models trained side
        by side (both updating) stay two probes."""
        if self.opt_steps:
            return
        for old in list(STATE.probes):
            born = self._peers_at_birth.get(id(old))
            if old is self or old.closed or born is None or old.opt_steps == 0 or old.opt_steps != born:
                continue
            old.close("ok", ended=False)  # its last steps compared at close, its check finished
            self.step, self.opt_steps = old.step, old.opt_steps
            self.backward += old.backward  # the new model's backward passes so far, on top
            self._backward_at_last_step = old.backward
            self._last_measured_step = old.step
            self.segment = old.segment + 1
            self._event(
                contract.REBOUND_EVENT,
                f"a rebuilt model (same parameters, a new wrapper or optimizer) took over after step "
                f"{self.step}: segment {self.segment} of this rank's record",
            )
            return

    def _start(self, optimizer: torch.optim.Optimizer) -> None:
        self._take_over_from_rebuilt()
        self._weights_before_first_update()
        if self._reduced_ids is not None:
            self._outside_reducer = _outside_every_reducer(self.module, optimizer)
        self._handles.append(StepWatch(optimizer, self._after_step_hook))
        # `syncdoctor experiment`'s hparams variant puts rank 0's hyperparameters in place here.
        hook_points.call(hook_points.BEFORE_SNAPSHOT, self, optimizer)
        names = [n for n, _ in self._named_params]
        snapshot = build_snapshot(
            rank=self.rank,
            world_size=self.world_size,
            model=self.model,
            optimizer=optimizer,
            loss_fn=self.loss_fn,
            loader=self.loader,
            global_batch=self.global_batch,
            tensor_names=names,
            init_param_fp=self._init_param_fp,
        )
        snapshot["init_param_fp_before_update"] = self._init_before_update and self.opt_steps == 0
        if self.init_params_changed:
            snapshot["init_params_changed"] = True
        if self.segment > 1:
            snapshot["segment"] = self.segment
        self.opt_state_replicated = type(optimizer).__name__ != "ZeroRedundancyOptimizer"  # ZeRO shards it
        snapshot["optimizer"]["state_replicated"] = self.opt_state_replicated
        if self.layout is not None and self.layout.sharded:
            snapshot["replica"] = {
                "classes": [list(c) for c in self.layout.classes],
                "keys": self.layout.keys,
                "data_key": self.layout.data_key,
                "mesh": self.layout.mesh,
                "init_fps": self._init_class_fps,
            }
        if self.init_param_fp_local is not None:
            snapshot["init_param_fp_local"] = self.init_param_fp_local
        self._config_fp = config_fingerprint(snapshot)
        self.writer.write(
            contract.KIND_SNAPSHOT, **snapshot, check_every=self.check_every, auto=self.auto, baseline=self.baseline
        )
        if self.distributed and self.world_size > 1:
            try:
                self.checker = CrossRankCheck(self, timeout_s=self.check_timeout_s())
            except Exception as exc:  # no store to reach: records without the live check
                self._event("check_unavailable", f"live cross-rank check unavailable: {type(exc).__name__}: {exc}", 0)

    def _weights_before_first_update(self) -> None:
        """The initial weights once more, at the first optimizer step and before its update,
        when the probe began watching earlier (at the DDP wrap, just after its broadcast).
        Weights the wrap's broadcast made equal can still part before any update: a
        checkpoint or pretrained state loaded into the model on some ranks only, after the
        wrap. The fingerprint of the wrap would call those replicas equal at the start."""
        if self._init_taken_at_bind or self.segment > 1 or self.opt_steps or not self._init_before_update:
            return
        fps = fingerprints(p for _, p in self._named_params)
        if combine(fps) != self._init_param_fp:
            self._init_param_fp, self._init_class_fps = combine(fps), self._per_class(fps)
            self.init_params_changed = True

    def check_timeout_s(self) -> float:
        """How long a reader waits for a rank's check before reporting it as not
        posted (it never blocks training meanwhile): the process-group timeout the job
        set, under `syncdoctor run`."""
        if self._check_timeout_s:
            return float(self._check_timeout_s)
        env = os.environ.get(settings.CHECK_TIMEOUT_ENV)
        return float(env) if env else 60.0

    def _install_model_hooks(self) -> None:
        if self._named_params:
            first = self._named_params[0][1]
            self._handles.append(GradWatch(first, self._on_backward))
        self._forward_handle: ForwardWatch | None = None
        self._arm_forward()
        if self.activations_every:
            # Every k-th block: the playbook's "intermediate loss" view of where ranks part.
            for i, child in enumerate(self.module.children()):
                if i % self.activation_stride == 0:
                    self._activation_names[id(child)] = f"{i}:{type(child).__name__}"
                    self._handles.append(ForwardWatch(child, post=self._on_activation))
        self._arm_local_norms()  # step 1 is measured in full

    def _arm_forward(self) -> None:
        """The forward watch (buffers, the input's fingerprint) is in place only in
        measured iterations: with nothing watched, every module keeps torch's fast call
        path. It hangs nothing on the module (probe/torch/hooks.py): a copy or a pickle of the
        user's module never reaches the probe."""
        wanted = self._measuring
        if wanted and self._forward_handle is None:
            self._forward_handle = ForwardWatch(
                self.module, pre=self._on_forward_start, post=self._on_forward_end, wrapper=self._wrapper
            )
        elif not wanted and self._forward_handle is not None:
            self._forward_handle.remove()
            self._forward_handle = None

    def _arm_local_norms(self) -> None:
        """For a detailed iteration: a watch on every parameter's gradient accumulator
        reads the local gradient. It runs inside backward before DDP's reducer hook
        and before a hand-written all_reduce, so what it sees is this rank's own
        gradient (accumulated over no_sync micro-steps; the last one wins). The watches
        exist only during detailed iterations: no per-step cost, and no DDP comm hook,
        so the user's own register_comm_hook is untouched."""
        for i, (_, p) in enumerate(self._named_params):
            self._local_norm_handles.append(GradWatch(p, self._on_local_grad, i))

    def _disarm_local_norms(self) -> None:
        for handle in self._local_norm_handles:
            handle.remove()
        self._local_norm_handles = []

    def _on_local_grad(self, index: int, param: torch.Tensor, incoming: torch.Tensor | None) -> None:
        if incoming is not None and not self.disabled:
            try:
                # What .grad will hold once torch adds `incoming` (the watch runs just before).
                # A norm, not pow(2).sum(): no host sync; a temporary only while accumulating.
                # The shard this rank holds: a DTensor's own norm would be a collective.
                grad = incoming if param.grad is None else param.grad + incoming
                self._local_norms[index] = torch.linalg.vector_norm(local_shard(grad).detach())
            except Exception:
                pass

    # ------------------------------------------------------------------ user API
    def loss(self, value: torch.Tensor | float) -> None:
        """Report this micro-step's local loss (a tensor is read at the step's end)."""
        if not self.disabled:
            # Not detached: the tensor is only read, and is let go at the step's end.
            self._losses.append(value if isinstance(value, torch.Tensor) else float(value))

    def batch(self, sample_ids: Any) -> None:
        """Report this micro-step's sample ids (or any tensor that identifies the batch)."""
        if self.disabled:
            return
        try:
            self._data_fps.append(ids_fingerprint(sample_ids))
            self._samples += len(sample_ids)
            if len(self._ids) < MAX_IDS:
                ids = sample_ids.tolist() if hasattr(sample_ids, "tolist") else list(sample_ids)
                self._ids.extend(int(i) for i in ids[: MAX_IDS - len(self._ids)])
        except Exception:
            pass  # ids that are not integers: the fingerprint is enough

    def scale(self, loss_scale: float) -> None:
        """Report the AMP loss scale in use for this iteration."""
        self._loss_scale = float(loss_scale)

    def skipped(self, overflow: bool = True) -> None:
        """Report an iteration that ended without an optimizer step (AMP overflow skip)."""
        if not self.disabled:
            self._guard(self._end_iteration, False, overflow)

    def joined(self) -> None:
        """This rank entered torch's `Join` context manager: its step count may end
        below the others' by design (recorded once per probe)."""
        if not self._joined and not self.disabled:
            self._joined = True
            self._event(
                contract.JOIN_EVENT,
                "the script trains under torch.distributed.algorithms.join.Join: a rank that runs out of "
                "batches shadows the others' collectives until every rank is done",
            )

    def close(self, status: str = "ok", message: str = "", ended: bool = True) -> None:
        """End this probe's record (`ended=False`: its segment only, a rebuilt model's
        probe goes on in the same record)."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.checker is not None:
                if status == "ok" and not self.disabled:
                    self._guard(self._check_at_close)
                self.checker.finish(min(CLOSE_WAIT_S, self.checker.timeout_s))
            if ended:
                # What this rank was doing after its last update: the backward calls
                # of the next one, where a hang or a crash leaves them.
                pending = {"pending_syncs": self._syncs} if self._syncs else {}
                self.writer.write(
                    contract.KIND_END,
                    rank=self.rank,
                    step=self.step,
                    t=time.time(),
                    status=status,
                    message=message[:2000],
                    **pending,
                )
        except Exception:
            pass
        self.remove_hooks()
        try:
            self.writer.close()
        except Exception:
            pass
        if self in STATE.probes:
            STATE.probes.remove(self)

    def remove_hooks(self) -> None:
        """Take every hook and watch off torch's objects (idempotent)."""
        for handle in [*self._handles, *self._local_norm_handles, self._forward_handle]:
            if handle is not None:
                try:
                    handle.remove()
                except Exception:
                    pass
        self._handles, self._local_norm_handles, self._forward_handle = [], [], None

    def _close_at_exit(self) -> None:
        # An uncaught exception was printed (PyErr_Print sets sys.last_value) before atexit runs.
        error = getattr(sys, "last_value", None)
        if error is not None:
            self.close("exception", f"{type(error).__name__}: {error}")
        else:
            self.close()

    # ------------------------------------------------------------------ hooks
    def _on_backward(self, param: torch.Tensor, _incoming: torch.Tensor | None) -> None:
        pending = self.backward - self._backward_at_last_step
        if pending and param.grad is None:
            # The gradients of this update's earlier micro-steps were set to None
            # (zero_grad) before any update read them: they were discarded. Where every
            # one of them ran inside no_sync, no collective paired with them, so they are
            # no micro-steps of this update (a trailing batch dropped this way is healthy).
            earlier = self._syncs[:-1]
            if len(earlier) == pending and set(earlier) == {"n"}:
                self.backward -= pending
                self._discarded += pending
                self._syncs = self._syncs[-1:]
        self.backward += 1

    def on_backward_call(self, loss: torch.Tensor) -> None:
        """Zero-code mode: a scalar passed to backward() is this micro-step's loss."""
        if not self.disabled:
            self._auto_losses.append(loss.detach())
            if self._wrapper is not None and len(self._syncs) < MAX_SYNCS:
                # What DDP decided at this backward's forward (it prepares its reducer there
                # from require_backward_grad_sync and notes the decision here): a flag set
                # between the forward and backward() changes nothing, and is not read.
                self._syncs += "s" if getattr(self._wrapper, "require_forward_param_sync", True) else "n"

    def after_backward_call(self) -> None:
        """Right after backward() returned. A synchronised call of a DDP wrapper returns
        once the all-reduce has written the averaged gradients: at measured steps the
        gradients' version counters are read there (a read per parameter), and at
        detailed steps their fingerprint is taken (one hash, as grad_fp's)."""
        if (
            self._measuring
            and not self.disabled
            and self._syncs[-1:] == "s"
            and (self.layout is None or not self.layout.sharded)
        ):
            self._guard(self._measure_reduced_grads)
        if self._hand_reduced:
            # A hand-written loop's reduces before this backward are not what the update reads.
            self._hand_reduced = {}

    def after_all_reduce(self, tensor: torch.Tensor) -> None:
        """A synchronous `dist.all_reduce(tensor)` returned. Without a DDP wrapper, an
        all_reduce of a parameter's gradient is the data-parallel reduce itself (a
        hand-written loop): at detailed steps its result is fingerprinted here, what
        DDP's synchronised backward() returning is for a wrapped model. A gradient
        reduced through a flat buffer or an async call is not matched: the record then
        holds no grad_reduced_fp (not observed). At every update's first call of a
        gradient it notes that the update had its reduce (unsynced_updates)."""
        if self.disabled or self._wrapper is not None:
            return
        if self.layout is not None and self.layout.sharded:
            return
        if not self._grad_reduced:
            self._note_grad_reduce(tensor)
        if not self._detailed:
            return
        self._hand_reduced[(tensor.data_ptr(), tensor.numel())] = (tensor, fingerprints([tensor])[0])

    def _note_grad_reduce(self, tensor: torch.Tensor) -> None:
        """Whether this all_reduce's tensor is (the memory of) a parameter's gradient:
        a loss or a metric averaged for logging is no reduce of the gradients. Called
        until the update's first hit: a loop that reduces in the parameters' order hits
        at the first parameter."""
        try:
            ptr = tensor.data_ptr()
            for p in self._params:
                grad = p.grad
                if grad is not None and grad.data_ptr() == ptr:
                    self._grad_reduced = True
                    return
        except Exception:  # a tensor subclass with no storage of its own (DTensor): not matched
            return

    def _hand_reduced_fp(self, grads: list[torch.Tensor | None]) -> int | None:
        """The gradients as the user's all_reduce calls left them, where every
        gradient the update read is the memory of one such call since the last backward()."""
        reduced, self._hand_reduced = self._hand_reduced, {}
        if not reduced:
            return None
        fps = []
        for grad in grads:
            hit = reduced.get((grad.data_ptr(), grad.numel())) if grad is not None else (None, 0)
            if hit is None:
                return None
            fps.append(hit[1])
        return combine(fps)

    def _measure_reduced_grads(self) -> None:
        self._grads_after_reduce = then = [(g, 0 if g is None else g._version) for g in [p.grad for p in self._params]]
        if self._detailed:
            grads = [g for g, _ in then]
            present = any(g is not None for g in grads)
            self._reduced_grad_fp = combine(fingerprints(grads, cache=self._views, kind="grad")) if present else None

    def _grad_writes(self) -> int | None:
        """In-place writes into the gradients (a replaced gradient: one) since the
        update's last synchronised backward() returned; None where it was not seen."""
        then, self._grads_after_reduce = self._grads_after_reduce, None
        if then is None or len(then) != len(self._params):
            return None
        writes = 0
        for p, (g, version) in zip(self._params, then, strict=True):
            now = p.grad
            if now is not g:
                writes += 1
            elif now is not None:
                writes += now._version - version
        return writes

    def _on_forward_start(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        # Inside DDP's forward, after it broadcast rank 0's buffers: the moment buffers must match.
        if self._measuring and self._buffer_fp is None and self._watching_forward():
            self._guard(self._measure_buffers, module)

    def _on_forward_end(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _out: Any
    ) -> None:
        # The input is read after the forward: torch's global forward-start hook sees no keywords.
        if self._measuring and torch.is_grad_enabled() and self._watching_forward():
            self._guard(self._measure_input, args, kwargs)

    def _watching_forward(self) -> bool:
        return not self.disabled and not (self._canary is not None and self._canary.running)

    def _measure_buffers(self, module: torch.nn.Module) -> None:
        if self._detailed or self._buffers is None:  # listing them walks every module
            self._buffers = [b for b in module.buffers() if b.is_floating_point()]
        buffers = self._buffers
        self._buffer_fp = combine(fingerprints(buffers, cache=self._views, kind="buffer")) if buffers else None

    def _measure_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._data_fps:
            # The input itself identifies the batch when the script reports no ids (at
            # check steps only: the hash reads every byte, and two ranks fed the same
            # batches are fed them at every step). A forward without grad (an
            # evaluation inside the step) is not the training batch.
            x = args[0] if args and args[0].__class__ is torch.Tensor else _model_input(args, kwargs)
            if x is not None:
                self._input_fps.append(ids_fingerprint(x))
                self._input_samples += int(x.shape[0]) if x.dim() else 1
        if self._canary is not None:
            self._canary.build(args, kwargs)  # once: the first training forward's structure

    def _on_activation(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        every = self.activations_every or 0
        if self._canary is not None and self._canary.running:
            return
        if every and (self.step + 1) % every == 0 and isinstance(output, torch.Tensor):
            o = output.detach().float()
            name = self._activation_names.get(id(module), type(module).__name__)
            self._acts.append({"name": name, "mean": o.mean().item(), "std": o.std().item() if o.numel() > 1 else 0.0})

    def _after_step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.disabled:
            try:
                if self._params:
                    self._version_after_step = self._params[0]._version
                    self._count_missing_grads()
                self._end_iteration(True, False)
            except SyncMismatchError:
                raise
            except Exception as exc:  # _guard's work, inline: this runs every step
                self.disable(exc)
        if self.stop_after is not None:
            self._updates_seen += 1  # counted here, so a probe disabled by an error still stops
            if self._updates_seen >= self.stop_after:
                self._stop_here()

    def _count_missing_grads(self) -> None:
        """Which trainable parameters the update just read without a gradient: the
        same on every rank in data parallelism, at every update (DDP fills a gradient
        a rank did not produce where another rank did). Every update, not only at
        checks: a branch some batches skip is skipped between the checks too."""
        missing = [i for i, p in enumerate(self._params) if p.grad is None]
        if missing:
            self._grads_missing += len(missing)
            self._grads_missing_fp = (self._grads_missing_fp + combine(missing)) & _U64
            self._grads_missing_first = self._named_params[missing[0]][0]

    def _stop_here(self) -> None:
        """`syncdoctor experiment --steps N`: close the records (the last check is
        posted and read) and leave the program as `sys.exit(0)` would. Every rank gets
        here after the same step, the collectives of that step done."""
        message = settings.STOPPED_MESSAGE.format(step=self.step, env=settings.STOP_AFTER_ENV)
        self.close("ok", message)
        _flush_streams()
        raise SystemExit(0)

    # ------------------------------------------------------------------ records
    def _end_iteration(self, stepped: bool, overflow: bool) -> None:
        self.step = step = self.step + 1
        self.opt_steps += stepped
        backward = self.backward
        micro = backward - self._backward_at_last_step
        self._backward_at_last_step = backward
        syncs, self._syncs = self._syncs, ""
        if stepped and syncs and "s" not in syncs:
            self._unsynced_updates += 1
            self._unsynced_first = self._unsynced_first or step
        elif self._wrapper is None:
            if self._grad_reduced:
                self._grad_reduced, self._reduces_grads = False, True
            elif stepped and self._reduces_grads:
                # No all_reduce of a gradient since the previous update, in a loop that
                # reduced them before an earlier update. An update before the first such
                # one is not counted, even once the loop shows that it reduces: the probe
                # may have been created after that update's reduce (zero-code mode creates
                # it at the first optimizer step where it cannot at the first backward).
                self._unsynced_updates += 1
                self._unsynced_first = self._unsynced_first or step
        now = time.time()
        loss = self._mean_loss()
        lr = self._lr()
        self._recent_losses[step % LAST_LOSSES] = loss
        if self._losses:
            self._losses = []
        if self._auto_losses:
            self._auto_losses = []
        # (Input fingerprints and ids come with measuring or with data fingerprints.)
        if self._measuring or self._data_fps or self._acts or overflow or self._loss_scale is not None:
            self._end_full_iteration(step, micro, now, loss, lr, overflow, syncs)
            return
        # Most steps: nothing but counters, loss and lr, a memory copy into the record
        # writer's tail. This runs every step, and after the model's own work all of
        # Python is cold here: every line counts.
        self.writer.step(step, micro, backward, self.opt_steps, now, loss, lr)
        if (step + 1) % self.check_every == 0:
            self._next_is_measured()

    @property
    def last_losses(self) -> list[tuple[int, float | None]]:
        """The last LAST_LOSSES steps' losses, oldest first (the evidence bundle)."""
        return [
            (s, self._recent_losses[s % LAST_LOSSES]) for s in range(max(1, self.step - LAST_LOSSES + 1), self.step + 1)
        ]

    def _end_full_iteration(
        self, step: int, micro: int, now: float, loss: float | None, lr: float | None, overflow: bool, syncs: str = ""
    ) -> None:
        data_fps, samples = (
            (self._data_fps, self._samples) if self._data_fps else (self._input_fps, self._input_samples)
        )
        # Optional fields that have no value are left out (absent reads as null).
        record: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "kind": contract.KIND_STEP,
            "rank": self.rank,
            "step": step,
            "micro": micro,
            "backward": self.backward,
            "opt_steps": self.opt_steps,
            "t": now,
            "loss": loss,
            "lr": lr,
        }
        if data_fps:
            record["samples"] = samples
            record["data_fp"] = combine(data_fps)
        if syncs and syncs != "s":
            record["syncs"] = syncs
        if self._discarded:
            record["discarded"] = self._discarded
        if self._loss_scale is not None:
            record["loss_scale"] = self._loss_scale
            record["overflow"] = overflow
        elif overflow:
            record["overflow"] = True
        if self._ids:
            record["ids"] = self._ids
        if self._acts:  # the steps activations_every picks, whether measured or not
            record["acts"] = self._acts
        measured = self._measuring
        if measured:
            self._last_measured_step = step
            if self.checker is not None and self.checker.healer is not None:
                self.checker.heal_due(step)  # on_mismatch="heal": before the fingerprints, which then see it
            record.update(self._measurements())
            if self._detailed and self._canary is not None:
                self._run_canary(record)
        self.writer.append(record)
        check_now = measured and self.checker is not None
        if check_now:
            self.checker.submit(record)  # type: ignore[union-attr]
        self._data_fps, self._samples, self._acts = [], 0, []
        self._input_fps, self._input_samples, self._ids = [], 0, []
        self._local_norms, self._buffer_fp = {}, None
        if measured:
            self._measuring = self.check_every == 1
            if self._detailed and (step + 1) % self.detail_every != 0:
                self._detailed = False
                self._disarm_local_norms()
            self._arm_forward()
        if (step + 1) % self.check_every == 0:
            self._next_is_measured()
        if check_now and self.checker is not None and self.checker.pending_error is not None:
            error, self.checker.pending_error = self.checker.pending_error, None
            raise error

    def _check_at_close(self) -> None:
        """The steps after the last check step, compared once more at the end of a run
        that ended well: parameters and hyperparameters as the last step left them
        (modes, buffers and gradients are not compared: code after training may change
        them on one rank by design). Every rank takes part or none does; none does where
        some rank's parameters changed after its last step (probe/torch/check.py)."""
        checker = self.checker
        if checker is None or checker.stopped:
            return
        unchecked = self.opt_steps > 0 and self.step > self._last_measured_step
        edited = bool(self._params) and self._params[0]._version != self._version_after_step
        go, why = checker.agree_at_close(unchecked, edited, min(CLOSE_WAIT_S, checker.timeout_s))
        if why:
            self._event(contract.CLOSE_CHECK_EVENT, why)
        if not go:
            return
        detailed, self._detailed = self._detailed, False
        try:
            measured = self._measurements()
        finally:
            self._detailed = detailed
        record = {
            "step": self.step,
            "micro": 0,
            "backward": self._backward_at_last_step,
            "opt_steps": self.opt_steps,
            **measured,
            "train_mode": None,
            "buffer_fp": None,
        }
        checker.submit(record)

    def _run_canary(self, record: dict[str, Any]) -> None:
        """The canary forward (probe/torch/canary.py) into `record`; off for the run, with one
        event saying why, when it cannot run here."""
        try:
            if self.layout is not None and self.layout.sharded:
                raise CanaryUnavailable("sharded parameters (FSDP/TP): their forward needs collectives")
            record["canary"] = self._canary.run()  # type: ignore[union-attr]
        except Exception as exc:
            self._canary = None
            self._event("canary_off", f"canary forward off for this run: {type(exc).__name__}: {exc}", record["step"])

    def _next_is_measured(self) -> None:
        self._measuring = True
        if not self._detailed and (self.step + 1) % self.detail_every == 0:
            self._detailed = True
            self._arm_local_norms()
        self._arm_forward()

    def _mean_loss(self) -> float | None:
        values = self._losses or self._auto_losses
        if not values:
            return None
        floats = [v if v.__class__ is float else v.item() for v in values]  # type: ignore[union-attr]  # not narrowed by __class__
        mean = float(floats[0] if len(floats) == 1 else sum(floats) / len(floats))
        if not self._losses and self._loss_scale:
            mean /= self._loss_scale  # what reached backward() was scaled by GradScaler
        return mean

    def _lr(self) -> float | None:
        try:
            return float(self.optimizer.param_groups[0]["lr"])  # type: ignore[union-attr]
        except Exception:
            return None

    def _measurements(self) -> dict[str, Any]:
        params = self._params
        out: dict[str, Any] = {}
        if self._reduced_ids is not None and (
            _grad_outside(self.module, self._reduced_ids) or any(p.grad is not None for _, p in self._outside_reducer)
        ):
            uncovered = [
                n for n, p in self.module.named_parameters() if p.grad is not None and id(p) not in self._reduced_ids
            ] + [n for n, p in self._outside_reducer if p.grad is not None]
            if uncovered:
                out["uncovered_grads"] = len(uncovered)
                out["uncovered_first"] = uncovered[0]
        # Summed over the updates so far (_count_missing_grads): a rank whose sum
        # differs updated other parameters than the rest.
        out["grads_missing"] = self._grads_missing
        if self._grads_missing:
            out["grads_missing_first"] = self._grads_missing_first
            out["grads_missing_fp"] = to_int64(self._grads_missing_fp)
        if self._unsynced_updates:
            out["unsynced_updates"] = self._unsynced_updates
            out["unsynced_first"] = self._unsynced_first
            out["unsynced_how"] = "no_sync" if self._wrapper is not None else "no_all_reduce"
        tensor_fps = fingerprints(params, cache=self._views, kind="param")
        out["param_fp"] = combine(tensor_fps)
        if (self.layout is None or not self.layout.sharded) and self.opt_state_replicated:
            # torch bumps a tensor's version at every in-place write: the update's own
            # writes are the same on every rank, so a count that differs across ranks
            # means code outside the update wrote into the parameters on some ranks
            # (not under ZeRO, where each rank updates its own part and receives the rest).
            out["param_writes"] = sum(p._version for p in params)
            rebound = self._rebound()
            if rebound:
                out["params_rebound"] = rebound
                out["params_rebound_first"] = self._rebound_first
        replica = self._per_class(tensor_fps)
        out["buffer_fp"] = self._buffer_fp
        out["train_mode"] = self._train_mode()
        out["config_fp"] = self._config_fp ^ self._hparams_fp()
        grad_writes = self._grad_writes()
        if grad_writes is not None:
            out["grad_writes"] = grad_writes
        if not self._detailed:
            if replica is not None:
                out["replica_fps"] = {"param": replica}
            self.last_tensor_fps = tensor_fps
            return out
        grads = [p.grad for p in params]
        present = [local_shard(g) for g in grads if g is not None]  # this rank's shards: no collective
        grad_fps = fingerprints(grads, cache=self._views, kind="grad")
        out["grad_fp"] = combine(grad_fps) if present else None
        if self._wrapper is None:
            self._reduced_grad_fp = self._hand_reduced_fp(grads)
        if self._reduced_grad_fp is not None:
            out["grad_reduced_fp"], self._reduced_grad_fp = self._reduced_grad_fp, None
        state, owner = self._optimizer_state()
        opt_fps = fingerprints(state, cache=self._views, kind="opt")
        out["opt_fp"] = combine(opt_fps)
        if replica is not None:
            by_param: list[list[int]] = [[] for _ in params]
            for index, fp in zip(owner, opt_fps, strict=True):
                by_param[index].append(fp)
            out["replica_fps"] = {
                "param": replica,
                "grad": self._per_class(grad_fps),
                "opt": self._per_class([combine(f) for f in by_param]),
            }
        if present:
            out["grad_fp16"] = fp16_exact(present)
            norms = torch._foreach_norm(present)
            out["grad_norm"] = float(torch.linalg.vector_norm(torch.stack(norms)))
            self.last_grad_norm = out["grad_norm"]
            if self.step % self.tensor_norms_every == 0 or self.step == 1:
                out["tensor_norms"] = [float(n) for n in norms]
        # The local norm stands beside the reduced one only where it covers the same
        # tensors: every gradient the update reads was seen arriving in backward. Under
        # FSDP2 the sharded parameters' gradients arrive by reduce-scatter, not through
        # their accumulators, so only the parameters outside it would be counted, and
        # their ratio to the whole reduced norm would read as a sum.
        if self._local_norms and len(self._local_norms) >= len(present):
            local = float(torch.linalg.vector_norm(torch.stack(list(self._local_norms.values()))))
            local /= self._loss_scale or 1.0
            out["grad_norm_local"] = local
            if out.get("grad_norm") is not None and local > 0:
                out["reduce_ratio"] = out["grad_norm"] / local
        self.last_tensor_fps = tensor_fps
        return out

    def _rebound(self) -> int:
        """The live bindings, at a check: how many of the module's trainable parameters are
        not the objects the probe watches (and the optimizer and DDP's reducer hold: one
        assigned after the wrap, `load_state_dict(..., assign=True)`), plus how many times a
        watched parameter's storage was replaced since the first check (`p.data = ...`, as
        `torch.nn.utils.prune.remove` and `module.half()` do: torch's version counters do not
        count it). The update writes into the same storage on every rank: a count that
        differs across ranks means code outside it rebound some ranks' parameters. The first
        such tensor seen is kept, by name. A loop over the parameters, at checks only."""
        params = self._params
        try:  # an empty tensor's address means nothing: 0
            storages = [p.data_ptr() if p.numel() else 0 for p in params]
        except Exception:  # a tensor without storage of its own (a subclass): not observed
            return 0
        before, self._storages = self._storages, storages
        if before is not None and before != storages:
            changed = [i for i, (a, b) in enumerate(zip(before, storages, strict=True)) if a != b]
            self._swaps += len(changed)
            self._rebound_first = self._rebound_first or self._named_params[changed[0]][0]
        ids = self._bound_ids
        if not _unwatched(self._modules, self._module_ids, ids):
            return self._swaps
        foreign = [n for n, p in self.module.named_parameters() if id(p) not in ids and p.requires_grad]
        if foreign:
            self._rebound_first = self._rebound_first or foreign[0]
        return self._swaps + len(foreign)

    def _hparams_fp(self) -> int:
        """groups_fingerprint of the optimizer's current hyperparameters, computed again
        only when one of them changed since the last check (a scheduler moves lr): the
        key holds each value with its class, and a zero's repr (0.0 and -0.0 are equal
        but print apart), so equal keys mean equal reprs."""
        groups = self.optimizer.param_groups if self.optimizer is not None else ()
        key = tuple(
            tuple(
                (k, v.__class__, v, v == 0 and repr(v))
                for k, v in g.items()
                if k != "params" and isinstance(v, (int, float, str, bool))
            )
            for g in groups
        )
        cached = self._hparams_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        fp = groups_fingerprint(self._group_hparams())
        self._hparams_cache = (key, fp)
        return fp

    def _group_hparams(self) -> list[dict[str, Any]]:
        if self.optimizer is None:
            return []
        return [
            {k: v for k, v in g.items() if k != "params" and isinstance(v, (int, float, str, bool))}
            for g in self.optimizer.param_groups
        ]

    def _optimizer_state(self) -> tuple[list[torch.Tensor], list[int]]:
        """The optimizer's state tensors in parameter order, and the index of the
        parameter each belongs to."""
        if self.optimizer is None:
            return [], []
        tensors, owner = [], []
        for i, p in enumerate(self._params):
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    tensors.append(value)
                    owner.append(i)
        return tensors, owner

    def _per_class(self, fps: list[int]) -> list[int] | None:
        """Per-tensor fingerprints folded per placement class (probe/torch/mesh.py); None
        under plain data parallelism, where the whole-model fingerprint is the class."""
        layout = self.layout
        if layout is None or not layout.sharded:
            return None
        return [combine(values) for values in layout.per_class(fps)]

    def _train_mode(self) -> str:
        return contract.train_mode([m.training for m in self._modules])

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` behind the one fence: a failure stands this probe down."""
        return safety.safe(fn, *args, on_error=self.disable)

    def _event(self, event: str, message: str, step: int | None = None) -> None:
        """One event record of this probe (records/contract.py: EVENT)."""
        self.writer.write(
            contract.KIND_EVENT,
            rank=self.rank,
            t=time.time(),
            step=self.step if step is None else step,
            event=event,
            message=message,
        )

    def disable(self, exc: BaseException) -> None:
        """Stop for the rest of the run on this rank, saying so once, in the records (what
        is lost: every step after this one) and on stderr. Training goes on untouched."""
        if self.disabled:
            return
        self.disabled = True
        if self._forward_handle is not None:  # the other hooks stay registered, as no-ops:
            self._forward_handle.remove()  # torch may be iterating over them right now
            self._forward_handle = None
        event, line = safety.disabled_lines(self.rank, self.step, exc)
        try:
            self._event("exception", event)
        except Exception:
            pass
        safety.say(line)


_U64 = (1 << 64) - 1


def _model_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The tensor that identifies a forward's batch: the first positional tensor (also
    inside a (x, y) batch tuple, as Lightning passes it), else a keyword input
    (`input_ids`, as the Hugging Face Trainer calls the model)."""
    for value in (*args[:1], kwargs.get("input_ids"), kwargs.get("pixel_values"), kwargs.get("input"), kwargs.get("x")):
        if isinstance(value, (tuple, list)) and value:
            value = value[0]
        if isinstance(value, torch.Tensor):
            return value
    return None


def fp16_exact(grads: list[torch.Tensor]) -> bool | None:
    """Whether the gradients hold float16 values (probe/core/precision.py)."""
    return precision.fp16_exact(
        grads, lambda g: str(g.dtype).removeprefix("torch."), lambda g, n: g.detach().reshape(-1)[:n].cpu().numpy()
    )


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class NullProbe:
    """What attach returns when disabled: the same calls, doing nothing."""

    def loss(self, value: Any) -> None: ...
    def batch(self, sample_ids: Any) -> None: ...
    def scale(self, loss_scale: float) -> None: ...
    def skipped(self, overflow: bool = True) -> None: ...
    def close(self, status: str = "ok", message: str = "", ended: bool = True) -> None: ...


def probe_for_module(module: torch.nn.Module) -> Probe | None:
    inner = module.module if isinstance(module, _ddp_class()) else module
    for probe in STATE.probes:
        if probe.model is module or probe.module is inner:
            return probe
    return None


def unwrap_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside a framework's wrapper (accelerate's
    AcceleratedOptimizer, Lightning's LightningOptimizer): the wrapper's step calls
    the inner one's, whose step hooks are the ones that fire."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    return optimizer


def attach(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *, enabled: bool = True, **kwargs: Any
) -> Probe | NullProbe:
    """Attach the probe in one line; see Probe for the options. Under `syncdoctor run`
    the model is usually watched already: that probe is returned (and bound to
    `optimizer`), so a script may call attach and still run zero-code."""
    if not enabled or settings.disabled_by_env():
        return NullProbe()
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    optimizer = unwrap_optimizer(optimizer)
    existing = probe_for_module(model)
    if existing is not None:
        for name in ("loss_fn", "loader", "global_batch"):
            if name in kwargs and existing.optimizer is None:
                setattr(existing, name, kwargs[name])
        if optimizer is not None:
            existing.bind_optimizer(optimizer)
        return existing
    return Probe(model, optimizer, **kwargs)

"""The torch probe: per-rank, per-step records and the live cross-rank check.

Cost model (shared facts): one pass over the parameter bytes is the floor of an
exact check. Every step records only what training already computed (loss, lr,
counters). Fingerprints, gradient norms and the check run every `check_every`
steps, and the check's collective is asynchronous: its result is read at the next
check, so training never waits for it.

Safety: every hook body runs under `_guard`, which turns any probe exception into a
recorded event and disables the probe; only `on_mismatch="raise"` raises, by choice.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from syncdoctor.probe.check import CrossRankCheck, SyncMismatchError
from syncdoctor.probe.fingerprint import combine, fingerprints, ids_fingerprint
from syncdoctor.probe.snapshot import build_snapshot
from syncdoctor.records import RecordWriter

log = logging.getLogger("syncdoctor")
_local = threading.local()  # set while the probe's own comm hook reduces a bucket
_active: list[Probe] = []

DEFAULT_CHECK_EVERY = 10
DEFAULT_RUN_DIR = "syncdoctor_run"


def _ddp_class() -> type:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


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
        on_mismatch: str = "warn",
        tensor_norms_every: int | None = None,
        activations_every: int | None = None,
        activation_stride: int = 2,
        check_timeout_s: float | None = None,
        register_comm_hook: bool = True,
    ) -> None:
        if on_mismatch not in ("warn", "dump", "raise"):
            raise ValueError("on_mismatch must be 'warn', 'dump' or 'raise'")
        self.run_dir = Path(run_dir or os.environ.get("SYNCDOCTOR_RUN_DIR", DEFAULT_RUN_DIR))
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else int(os.environ.get("RANK", 0))
        self.world_size = dist.get_world_size() if self.distributed else int(os.environ.get("WORLD_SIZE", 1))
        self.model = model
        self.module = model.module if isinstance(model, _ddp_class()) else model
        self.optimizer: torch.optim.Optimizer | None = None
        self.loss_fn, self.loader, self.global_batch = loss_fn, loader, global_batch
        self.check_every = max(1, int(check_every or os.environ.get("SYNCDOCTOR_CHECK_EVERY", DEFAULT_CHECK_EVERY)))
        self.tensor_norms_every = tensor_norms_every or self.check_every * 5
        self.activations_every = activations_every
        self.activation_stride = max(1, activation_stride)
        self._check_timeout_s = check_timeout_s
        self.on_mismatch = on_mismatch
        self.writer = RecordWriter(self.run_dir, self.rank)
        self.disabled = False
        self.closed = False
        self._handles: list[Any] = []
        # counters
        self.step = 0  # iterations ended: optimizer steps plus reported skips
        self.opt_steps = 0
        self.backward = 0
        self._backward_at_last_step = 0
        # what the current iteration reported
        self._losses: list[torch.Tensor | float] = []
        self._data_fps: list[int] = []
        self._samples = 0
        self._loss_scale: float | None = None
        self._pre_reduce_sq: float = 0.0
        self._pre_reduce_seen = False
        self._buffer_fp: int | None = None
        self._acts: list[list[Any]] = []
        self._last_tensor_fps: list[int] = []
        self._last_grad_fps: list[int] = []
        self._measuring = True  # the first iteration is measured: step 1 is a check step
        self.checker: CrossRankCheck | None = None
        self._named_params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self._guard(self._install_model_hooks, register_comm_hook)
        if optimizer is not None:
            self.bind_optimizer(optimizer)
        _active.append(self)
        atexit.register(self.close)

    # ------------------------------------------------------------------ setup
    def bind_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Start recording steps of `optimizer` (called by attach, or on the first step
        seen when attached without code changes)."""
        if self.optimizer is not None:
            return
        self.optimizer = optimizer
        self._guard(self._start, optimizer)

    def _start(self, optimizer: torch.optim.Optimizer) -> None:
        self._handles.append(optimizer.register_step_post_hook(self._after_step_hook))
        names = [n for n, _ in self._named_params]
        self.writer.write(
            "snapshot",
            **build_snapshot(
                rank=self.rank, world_size=self.world_size, model=self.model, optimizer=optimizer,
                loss_fn=self.loss_fn, loader=self.loader, global_batch=self.global_batch,
                tensor_names=names, init_param_fp=combine(fingerprints(p for _, p in self._named_params)),
            ),
            check_every=self.check_every,
        )
        if self.distributed and self.world_size > 1:
            self.checker = CrossRankCheck(self, timeout_s=self.check_timeout_s())

    def check_timeout_s(self) -> float:
        """How long a rank waits for the others' check: never longer than the
        process-group timeout the job set, so the probe cannot be what hangs."""
        if self._check_timeout_s:
            return float(self._check_timeout_s)
        env = os.environ.get("SYNCDOCTOR_CHECK_TIMEOUT")
        return float(env) if env else 60.0

    def _install_model_hooks(self, register_comm_hook: bool) -> None:
        if self._named_params:
            first = self._named_params[0][1]
            self._handles.append(first.register_post_accumulate_grad_hook(self._on_backward))
        self._handles.append(self.module.register_forward_pre_hook(self._on_forward_start))
        if self.activations_every:
            # Every k-th block: the playbook's "intermediate loss" view of where ranks part.
            for i, child in enumerate(self.module.children()):
                if i % self.activation_stride == 0:
                    name = f"{i}:{type(child).__name__}"
                    self._handles.append(child.register_forward_hook(self._activation_hook(name)))
        if register_comm_hook and isinstance(self.model, _ddp_class()):
            self._register_measuring_comm_hook()
        _patch_all_reduce()

    def _register_measuring_comm_hook(self) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # No annotations: DDP inspects them, and this module's are strings (PEP 563).
        def measuring_allreduce(state, bucket):  # type: ignore[no-untyped-def]
            if self._measuring:
                self._guard(self._add_pre_reduce, bucket.buffer())
            _local.inside = True
            try:
                return default_hooks.allreduce_hook(state, bucket)
            finally:
                _local.inside = False

        try:
            self.model.register_comm_hook(None, measuring_allreduce)
        except RuntimeError:  # the user already registered one: all_reduce is measured instead
            pass

    # ------------------------------------------------------------------ user API
    def loss(self, value: torch.Tensor | float) -> None:
        """Report this micro-step's local loss (a tensor is read at the step's end)."""
        if not self.disabled:
            self._losses.append(value.detach() if isinstance(value, torch.Tensor) else float(value))

    def batch(self, sample_ids: Any) -> None:
        """Report this micro-step's sample ids (or any tensor that identifies the batch)."""
        if self.disabled:
            return
        try:
            self._data_fps.append(ids_fingerprint(sample_ids))
            self._samples += len(sample_ids)
        except Exception:
            pass

    def scale(self, loss_scale: float) -> None:
        """Report the AMP loss scale in use for this iteration."""
        self._loss_scale = float(loss_scale)

    def skipped(self, overflow: bool = True) -> None:
        """Report an iteration that ended without an optimizer step (AMP overflow skip)."""
        if not self.disabled:
            self._guard(self._end_iteration, False, overflow)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            if self.checker is not None:
                self.checker.finish()
            self.writer.write("end", rank=self.rank, step=self.step, t=time.time(), status="ok", message="")
        except Exception:
            pass
        for handle in self._handles:
            try:
                handle.remove()
            except Exception:
                pass
        self.writer.close()
        if self in _active:
            _active.remove(self)

    # ------------------------------------------------------------------ hooks
    def _on_backward(self, _param: torch.Tensor) -> None:
        self.backward += 1

    def _on_forward_start(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        # Inside DDP's forward, after it broadcast rank 0's buffers: the moment buffers must match.
        if self._measuring and not self.disabled:
            self._guard(self._measure_forward_start, module, args)

    def _measure_forward_start(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        if self._buffer_fp is None:
            buffers = [b for b in module.buffers() if b.is_floating_point()]
            self._buffer_fp = combine(fingerprints(buffers)) if buffers else None
        if not self._data_fps and args and isinstance(args[0], torch.Tensor):
            self._data_fps.append(ids_fingerprint(args[0]))
            self._samples += int(args[0].shape[0]) if args[0].dim() else 1

    def _activation_hook(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            every = self.activations_every or 0
            if every and (self.step + 1) % every == 0 and isinstance(output, torch.Tensor):
                o = output.detach().float()
                self._acts.append([name, o.mean().item(), o.std().item() if o.numel() > 1 else 0.0])

        return hook

    def _add_pre_reduce(self, tensor: torch.Tensor) -> None:
        if tensor.is_floating_point() and tensor.numel() >= 64:
            self._pre_reduce_sq += float(tensor.detach().float().pow(2).sum())
            self._pre_reduce_seen = True

    def _after_step_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.disabled:
            return
        self._guard(self._end_iteration, True, False)

    # ------------------------------------------------------------------ records
    def _end_iteration(self, stepped: bool, overflow: bool) -> None:
        self.step += 1
        self.opt_steps += int(stepped)
        micro = self.backward - self._backward_at_last_step
        self._backward_at_last_step = self.backward
        record: dict[str, Any] = {
            "rank": self.rank, "step": self.step, "micro": micro, "backward": self.backward,
            "opt_steps": self.opt_steps, "t": time.time(), "loss": self._mean_loss(),
            "lr": self._lr(), "samples": self._samples or None,
            "data_fp": combine(self._data_fps) if self._data_fps else None,
            "loss_scale": self._loss_scale, "overflow": overflow if (overflow or self._loss_scale) else None,
        }
        if self._measuring:
            record.update(self._measurements())
        self.writer.write("step", **record)
        check_now = self._measuring and self.checker is not None
        if check_now:
            self.checker.submit(record)  # type: ignore[union-attr]
        self._losses, self._data_fps, self._samples, self._acts = [], [], 0, []
        self._pre_reduce_sq, self._pre_reduce_seen, self._buffer_fp = 0.0, False, None
        self._measuring = (self.step + 1) % self.check_every == 0 or self.step + 1 == 1
        if check_now and self.checker is not None and self.checker.pending_error is not None:
            error, self.checker.pending_error = self.checker.pending_error, None
            raise error

    def _mean_loss(self) -> float | None:
        if not self._losses:
            return None
        values = [v.item() if isinstance(v, torch.Tensor) else v for v in self._losses]
        return float(sum(values) / len(values))

    def _lr(self) -> float | None:
        try:
            return float(self.optimizer.param_groups[0]["lr"])  # type: ignore[union-attr]
        except Exception:
            return None

    def _measurements(self) -> dict[str, Any]:
        params = [p for _, p in self._named_params]
        grads = [p.grad for p in params]
        present = [g for g in grads if g is not None]
        out: dict[str, Any] = {}
        tensor_fps = fingerprints(params)
        out["param_fp"] = combine(tensor_fps)
        grad_fps = fingerprints(grads)
        out["grad_fp"] = combine(grad_fps) if present else None
        out["opt_fp"] = combine(fingerprints(self._optimizer_state()))
        out["buffer_fp"] = self._buffer_fp
        out["train_mode"] = self._train_mode()
        if present:
            norms = torch._foreach_norm(present)
            out["grad_norm"] = float(torch.linalg.vector_norm(torch.stack(norms)))
            if self.step % self.tensor_norms_every == 0 or self.step == 1:
                out["tensor_norms"] = [float(n) for n in norms]
        if self._pre_reduce_seen:
            local = math.sqrt(self._pre_reduce_sq) / (self._loss_scale or 1.0)
            out["grad_norm_local"] = local
            if out.get("grad_norm") is not None and local > 0:
                out["reduce_ratio"] = out["grad_norm"] / local
        if self._acts:
            out["acts"] = self._acts
        self._last_tensor_fps, self._last_grad_fps = tensor_fps, grad_fps
        return out

    def _optimizer_state(self) -> list[torch.Tensor]:
        if self.optimizer is None:
            return []
        tensors = []
        for _, p in self._named_params:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    tensors.append(value)
        return tensors

    def _train_mode(self) -> str:
        modes = [m.training for m in self.module.modules()]
        return f"{sum(modes)}/{len(modes)}"

    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except SyncMismatchError:
            raise
        except Exception as exc:  # never let a probe failure reach training
            self.disabled = True
            try:
                self.writer.write("event", rank=self.rank, t=time.time(), step=self.step,
                                  event="exception", message=f"probe disabled: {type(exc).__name__}: {exc}")
                print(f"syncdoctor: probe disabled on rank {self.rank}: {type(exc).__name__}: {exc}",
                      file=sys.stderr)
            except Exception:
                pass
            return None


class NullProbe:
    """What attach returns when disabled: the same calls, doing nothing."""

    def loss(self, value: Any) -> None: ...
    def batch(self, sample_ids: Any) -> None: ...
    def scale(self, loss_scale: float) -> None: ...
    def skipped(self, overflow: bool = True) -> None: ...
    def close(self) -> None: ...


_original_all_reduce: Callable[..., Any] | None = None


def _patch_all_reduce() -> None:
    """Measure the local gradient norm entering every all_reduce during measured
    iterations: hand-written data parallelism and users' own DDP comm hooks."""
    global _original_all_reduce
    if _original_all_reduce is not None:
        return
    _original_all_reduce = dist.all_reduce

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_local, "inside", False):
            for probe in _active:
                if probe._measuring and not probe.disabled:
                    probe._guard(probe._add_pre_reduce, tensor)
        return _original_all_reduce(tensor, *args, **kwargs)  # type: ignore[misc]

    dist.all_reduce = all_reduce


def attach(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
           enabled: bool = True, **kwargs: Any) -> Probe | NullProbe:
    """Attach the probe in one line; see Probe for the options."""
    if not enabled or os.environ.get("SYNCDOCTOR_DISABLE"):
        return NullProbe()
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return Probe(model, optimizer, **kwargs)

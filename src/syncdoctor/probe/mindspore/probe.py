"""The syncdoctor probe for MindSpore: the same records as the torch probe (docs/records.md).

Two ways in:
- `Model.train(..., callbacks=[SyncDoctorCallback(run_dir)])`: a snapshot at
  `on_train_begin`, a step record at every `on_train_step_end`;
- a custom `value_and_grad` + `nn.DistributedGradReducer` loop:
  `probe = MindSporeProbe(net, optimizer, run_dir)`, then `probe.after_step(loss=..., grads=...)`
  after each optimizer update.
`attach.install_autoattach()` patches `Model.train` so that the callback is added without any
change to the user's script (used by `syncdoctor run -- msrun ...` through sitecustomize).

Measured on MindSpore 2.10 CPU (shared/facts.md): healthy data parallelism keeps the
parameters bitwise identical after every step, but nothing is broadcast at the start,
and BatchNorm moving statistics are never synchronised, so they are not compared. The
live check gathers a few int64 fingerprints with `ops.AllGather` (AllReduce is SUM-only
on CPU, and a SUM cannot say which rank differs). The probe never raises into
training: every public entry point catches everything and records it as an event.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from syncdoctor import settings
from syncdoctor.probe.core import precision, safety
from syncdoctor.probe.core.compare import FIELDS, compare
from syncdoctor.probe.core.evidence import LAST_LOSSES, dump_evidence
from syncdoctor.probe.core.fingerprint import array_fingerprint, combine, ids_fingerprint
from syncdoctor.probe.core.snapshot import build_common_snapshot, public_scalars
from syncdoctor.probe.core.verdict import mismatch_message, print_verdict
from syncdoctor.probe.mindspore.watch import (
    W,
    as_numpy,
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
from syncdoctor.records import contract
from syncdoctor.records.constants import MAX_IDS
from syncdoctor.records.writer import RecordWriter
from syncdoctor.settings import DEFAULT_RUN_DIR, RUN_DIR_ENV, SyncMismatchError

__all__ = ["MindSporeProbe", "SyncDoctorCallback", "SyncMismatchError"]
# The gathered values a check record keeps in its `detail`, one list per value (a rank each).
MS_DETAIL = ("step", "backward", "param_fp", "opt_fp", "mode", "config_fp")
_DEFAULT_DATASET_SEED = 5489  # mindspore.dataset's seed when nobody set one (measured, 2.10)


def _ms() -> Any:
    import mindspore

    return mindspore


def rank_and_size() -> tuple[int, int]:
    """From the communication group when init() ran, else from msrun's environment."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:
        return int(os.environ.get("RANK_ID", 0) or 0), int(os.environ.get("RANK_SIZE", 1) or 1)


def _cell_hparams(cell: Any) -> dict[str, Any]:
    """Public scalar attributes a user set on a Cell (a loss's margins, gammas, ...)."""
    if cell is None:
        return {}
    try:
        from mindspore import nn

        internal = set(vars(nn.Cell()).keys())
    except Exception:
        internal = set()
    return public_scalars(cell, internal)


def _size(param: Any) -> int:
    """Elements of a MindSpore Parameter (1 for a scalar)."""
    try:
        return int(np.prod(param.shape)) if param.shape else 1
    except Exception:
        return 0


def dataset_info(dataset: Any) -> dict[str, Any]:
    """Shuffle/shard/batch settings found by walking a mindspore.dataset pipeline."""
    info: dict[str, Any] = {}
    if dataset is None or isinstance(dataset, dict):
        return dict(dataset or {})
    try:
        info["type"] = type(dataset).__name__
        node, depth, ops = dataset, 0, []
        while node is not None and depth < 32:
            ops.append(type(node).__name__)
            attrs = vars(node)
            if "batch_size" in attrs and "batch_size" not in info:
                info["batch_size"] = attrs.get("batch_size")
                info["drop_last"] = attrs.get("drop_remainder")
            if attrs.get("num_shards") is not None and "num_replicas" not in info:
                info["num_replicas"] = attrs.get("num_shards")
                info["rank"] = attrs.get("shard_id")
            sampler = attrs.get("sampler")
            if sampler is not None and "sampler" not in info and not isinstance(sampler, (list, tuple)):
                # The source's sampler decides the order: a DistributedSampler permutes the
                # whole set with the seed it took when it was built (the dataset seed then),
                # then cuts this rank's shard. Its shuffle is a `Shuffle` enum (or a bool).
                info["sampler"] = type(sampler).__name__
                flag = getattr(sampler, "shuffle", None)
                if flag is not None:
                    info["shuffle"] = str(getattr(flag, "value", flag)).lower() not in ("false", "0")
                elif info["sampler"] in ("RandomSampler", "SequentialSampler"):
                    info["shuffle"] = info["sampler"] == "RandomSampler"
                seed = getattr(sampler, "seed", None)
                if isinstance(seed, int) and not isinstance(seed, bool):
                    info["seed"] = seed
            if "shuffle_flag" in attrs and "shuffle" not in info:
                # Without a sampler to read: a bool, or the file sources' mode (0: no shuffle).
                flag = attrs.get("shuffle_flag")
                info["shuffle"] = flag if isinstance(flag, bool) else flag not in (0, None)
            if type(node).__name__ == "ShuffleDataset":
                info["shuffle_op"] = True
                info["shuffle_buffer"] = attrs.get("buffer_size")
            if "source_len" in attrs:
                info["dataset_len"] = attrs.get("source_len")
            children = attrs.get("children") or []
            node = children[0] if children else None
            depth += 1
        info["pipeline"] = ops
        info.setdefault("num_replicas", None)
        info.setdefault("rank", None)
    except Exception as exc:
        info["error"] = repr(exc)
    return info


def _parallel_info() -> dict[str, Any]:
    ms = _ms()
    out: dict[str, Any] = {"wrapper": "mindspore"}
    for key in ("parallel_mode", "gradients_mean", "parameter_broadcast", "device_num"):
        try:
            out[key] = ms.get_auto_parallel_context(key)
        except Exception:
            out[key] = None
    try:
        out["mode"] = "GRAPH" if ms.get_context("mode") == ms.GRAPH_MODE else "PYNATIVE"
        out["device_target"] = ms.get_context("device_target")
    except Exception:
        pass
    try:
        from mindspore.communication import GlobalComm

        out["backend"] = str(getattr(GlobalComm, "BACKEND", ""))
        out["group"] = str(getattr(GlobalComm, "WORLD_COMM_GROUP", ""))
    except Exception:
        pass
    return out


def _loss_scale_info(scaler: Any) -> dict[str, Any] | None:
    if scaler is None:
        return None
    info: dict[str, Any] = {"type": type(scaler).__name__}
    for attr in ("scale_value", "scale_factor", "scale_window", "loss_scale_value", "init_loss_scale"):
        value = getattr(scaler, attr, None)
        if value is not None:
            info[attr] = to_float(value) if hasattr(value, "asnumpy") else value
    return info


class MindSporeProbe:
    """Records one rank of a MindSpore data-parallel run; see the module docstring."""

    def __init__(
        self,
        network: Any,
        optimizer: Any = None,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        loss_fn: Any = None,
        dataset: Any = None,
        grad_reducer: Any = None,
        loss_scaler: Any = None,
        global_batch: int | None = None,
        check_every: int | None = None,
        on_mismatch: str | None = None,
        extra: dict[str, Any] | None = None,
        enabled: bool = True,
        params: list[Any] | None = None,
        mode_cells: list[Any] | None = None,
        init_param_fp: int | None = None,
        auto: bool = False,
    ) -> None:
        """network: the model (its trainable parameters are fingerprinted, its cells'
        train/eval modes recorded); zero-code mode passes `params` (what the optimizer
        updates), `mode_cells` and the `init_param_fp` taken when the optimizer was built."""
        self.enabled = enabled and not settings.disabled_by_env()
        self.network, self.optimizer, self.loss_fn = network, optimizer, loss_fn
        self.check_every = settings.check_every_from_env(check_every)
        self.on_mismatch = settings.on_mismatch_from_env(on_mismatch)
        self.run_dir = Path(run_dir or os.environ.get(RUN_DIR_ENV) or DEFAULT_RUN_DIR)
        self.log_path: Path | None = None  # the evidence bundle's log tail: the launcher's log is not ours to know
        self._recent_losses: deque[tuple[int, float | None]] = deque(maxlen=LAST_LOSSES)
        self.last_grad_norm: float | None = None
        self.auto = auto
        self.step = 0
        self.backward = 0
        self.opt_steps = 0
        self.checks_disabled: str | None = None
        self.writer: RecordWriter | None = None
        self._params: list[Any] = []
        self._opt_state: list[Any] = []
        self._opt_hparams: list[Any] = []
        self._mode_cells: list[Any] = []
        self._gather: Any = None
        if not self.enabled:
            return
        try:
            self.rank, self.world_size = rank_and_size()
            self.writer = RecordWriter(self.run_dir, self.rank)
            self._params = list(params) if params is not None else list(network.trainable_params())
            ids = {id(p) for p in self._params}
            if optimizer is not None:
                # Momentum accumulators, lr, momentum and step counter: everything the
                # optimizer owns that is not a weight must also stay equal on every rank.
                owned = sorted((p for p in optimizer.get_parameters() if id(p) not in ids), key=lambda p: p.name)
                # Scalars the optimizer keeps as Parameters (learning_rate, momentum, ...) are
                # its configuration, compared as such: a hyperparameter changed on one rank is
                # a bug, not a state that drifted. The step counter is a counter.
                self._opt_hparams = [p for p in owned if _size(p) == 1 and "global_step" not in p.name]
                self._opt_state = [p for p in owned if not (_size(p) == 1 and "global_step" not in p.name)]
            if mode_cells is not None:
                self._mode_cells = list(mode_cells)
            elif network is not None:
                self._mode_cells = [c for _, c in network.cells_and_names()]
            self._snapshot(dataset, grad_reducer, loss_scaler, global_batch, extra or {}, init_param_fp)
        except Exception as exc:
            self.disable(exc)

    def disable(self, exc: BaseException) -> None:
        """Stop for the rest of the run on this rank, saying so once, in the records (what
        is lost: every step after this one) and on stderr. Training goes on untouched."""
        if not self.enabled:
            return
        self.enabled = False
        event, line = safety.disabled_lines(getattr(self, "rank", 0), self.step, exc)
        try:
            self._event("exception", event)
        except Exception:
            pass
        safety.say(line)

    # -- records -------------------------------------------------------------------
    def _event(self, event: str, message: str) -> None:
        if self.writer is not None:
            self.writer.write(
                contract.KIND_EVENT,
                rank=getattr(self, "rank", 0),
                t=time.time(),
                step=self.step,
                event=event,
                message=message[:2000],
            )

    def _snapshot(
        self,
        dataset: Any,
        grad_reducer: Any,
        loss_scaler: Any,
        global_batch: int | None,
        extra: dict[str, Any],
        init_param_fp: int | None = None,
    ) -> None:
        ms = _ms()
        import mindspore.dataset as ds

        ddp = _parallel_info()
        reducer = reducer_settings(grad_reducer)
        if reducer:
            # What decides the reduce, beside the context's gradients_mean: a reducer that
            # sums, or divides by a degree that is not its group's size, is seen at step 0.
            ddp["wrapper"] = type(grad_reducer).__name__
            ddp.update({f"reducer_{k}": v for k, v in reducer.items()})
        ddp["loss_scale_manager"] = _loss_scale_info(loss_scaler)
        ddp["broadcast_buffers"] = False  # MindSpore never syncs BatchNorm statistics
        ddp.update(extra.pop("ddp", {}))
        ms_seed = ms.get_seed()
        ds_seed = ds.config.get_seed()
        opt = self.optimizer
        groups = []
        if opt is not None:
            group = {"lr": to_float(opt.get_lr()) if hasattr(opt, "get_lr") else None}
            for attr in ("momentum", "weight_decay", "dampening", "nesterov", "beta1", "beta2", "eps"):
                value = getattr(opt, attr, None)
                if value is not None:
                    group[attr] = to_float(value) if hasattr(value, "asnumpy") else value
            groups.append(group)
        loader = dataset_info(dataset)
        loader.update(extra.pop("loader", {}))
        snapshot = build_common_snapshot(
            framework="mindspore",
            rank=self.rank,
            world_size=self.world_size,
            versions={"python": platform.python_version(), "mindspore": ms.__version__, "numpy": np.__version__},
            rng={},
            # None for ms_seed means nobody called ms.set_seed; a dataset seed of 5489 is the
            # library default (ds.config.set_seed never called) and also seeds nothing else.
            seed={
                "ms_seed": ms_seed,
                "dataset_seed": ds_seed,
                "dataset_seed_is_default": ds_seed == _DEFAULT_DATASET_SEED,
            },
            loss_fn=self.loss_fn,
            loss_params=_cell_hparams(self.loss_fn),
            optimizer={
                "type": type(opt).__name__ if opt is not None else None,
                "param_groups": groups,
                "n_params": len(self._params),
            },
            ddp=ddp,
            loader=loader,
            global_batch=global_batch,
            tensor_names=[p.name for p in self._params],
            init_param_fp=init_param_fp if init_param_fp is not None else combine(self._tensor_fps(self._params)),
        )
        snapshot.update(check_every=self.check_every, auto=self.auto)
        if ddp.get("mode") == "GRAPH" and ddp.get("parameter_broadcast"):
            # GRAPH mode broadcasts rank 0's parameters at the first compile: what was
            # built before is this rank's own (as torch's before DDP's broadcast).
            snapshot["init_param_fp_local"] = snapshot.pop("init_param_fp")
            snapshot["init_param_fp"] = None
        snapshot.update(extra)
        assert self.writer is not None
        self.writer.write(contract.KIND_SNAPSHOT, **snapshot)

    @staticmethod
    def _tensor_fps(params: list[Any]) -> list[int]:
        return [array_fingerprint(as_numpy(p)) for p in params]

    def _train_mode(self) -> str:
        """The contract's one encoding (records/contract.py TRAIN_MODE), in cell order."""
        return contract.train_mode([bool(getattr(c, "training", False)) for c in self._mode_cells])

    def is_check_step(self, step: int) -> bool:
        """Step 1 and every check_every-th step are measured in full (as the torch probe)."""
        return step == 1 or bool(self.check_every and step % self.check_every == 0)

    # -- the per-step entry point -------------------------------------------------------
    def after_step(
        self,
        loss: Any = None,
        grads: Any = None,
        *,
        grads_local: Any = None,
        batch_ids: Any = None,
        micro: int = 1,
        samples: int | None = None,
        overflow: bool | None = None,
        loss_scale: float | None = None,
        opt_steps: int | None = None,
        data_fp: int | None = None,
    ) -> None:
        """Call once after each optimizer update (skipped updates too, with overflow=True).
        grads: the gradients the optimizer used (post-reduce); grads_local: this rank's own.
        opt_steps: updates applied so far (the optimizer's global_step), when known."""
        if not self.enabled or self.writer is None:
            return
        self.step += 1
        self.backward += micro
        self.opt_steps = opt_steps if opt_steps is not None else self.opt_steps + (not overflow)
        try:
            self._after_step(loss, grads, grads_local, batch_ids, micro, samples, overflow, loss_scale, data_fp)
        except SyncMismatchError:
            raise  # on_mismatch="raise": stopping the training is what the user asked for
        except Exception as exc:  # never let the probe stop training
            self.disable(exc)
        stop_after = settings.stop_after_from_env()
        if stop_after is not None and self.step >= stop_after:  # `syncdoctor experiment --steps N`
            self.close("ok", settings.STOPPED_MESSAGE.format(step=self.step, env=settings.STOP_AFTER_ENV))
            raise SystemExit(0)

    def _after_step(
        self,
        loss: Any,
        grads: Any,
        grads_local: Any,
        batch_ids: Any,
        micro: int,
        samples: int | None,
        overflow: bool | None,
        loss_scale: float | None,
        data_fp: int | None,
    ) -> None:
        ids = None
        if batch_ids is not None:
            ids = (
                np.concatenate([np.asarray(as_numpy(b)).reshape(-1) for b in batch_ids])
                if isinstance(batch_ids, (list, tuple))
                else np.asarray(as_numpy(batch_ids)).reshape(-1)
            )
            data_fp = ids_fingerprint(ids.astype(np.int64))
            samples = samples if samples is not None else int(ids.size)
        lr = None
        if self.optimizer is not None and hasattr(self.optimizer, "get_lr"):
            lr = to_float(self.optimizer.get_lr())
        record: dict[str, Any] = dict(
            rank=self.rank,
            step=self.step,
            micro=micro,
            backward=self.backward,
            opt_steps=self.opt_steps,
            t=time.time(),
            loss=to_float(loss),
            lr=lr,
            data_fp=data_fp,
            samples=samples,
            loss_scale=loss_scale,
            overflow=overflow,
        )
        if ids is not None and ids.size <= MAX_IDS:  # for overlap and coverage, as the torch probe
            record["ids"] = [int(i) for i in ids]
        measured = self.is_check_step(self.step)
        tensor_fps: list[int] = []
        if measured:  # every parameter's bytes: only at check steps, as the torch probe
            tensor_fps = self._tensor_fps(self._params)
            record["param_fp"] = combine(tensor_fps)
            record["opt_fp"] = combine(self._tensor_fps(self._opt_state))
            record["train_mode"] = self._train_mode()
            if grads is not None:
                grad_arrays = [as_numpy(g) for g in grads]
                record["grad_fp"] = combine([array_fingerprint(a) for a in grad_arrays])
                record["grad_norm"] = self.last_grad_norm = _global_norm(grad_arrays)
                record["grad_fp16"] = _fp16_exact(grad_arrays)
                local = _global_norm(grads_local)
                if local is not None:
                    record["grad_norm_local"] = local  # the caller passes them unscaled
                    if record["grad_norm"] and local:
                        record["reduce_ratio"] = record["grad_norm"] / record["grad_norm_local"]
        self._recent_losses.append((self.step, record["loss"]))
        check = measured and self.world_size > 1
        if check:
            record["tensor_fps"] = tensor_fps
        assert self.writer is not None
        self.writer.write(
            contract.KIND_STEP, **{k: v for k, v in record.items() if v is not None or k in ("loss", "lr")}
        )
        if check and not self.checks_disabled:
            self._check(
                record["param_fp"],
                record["opt_fp"],
                tensor_fps,
                record["train_mode"],
                combine(self._tensor_fps(self._opt_hparams)),
            )

    # -- the live cross-rank check ------------------------------------------------------------
    def _allgather(self, values: list[int]) -> np.ndarray:
        """[world_size, len(values)] int64. The cadence is the probe's own step count, which
        equals the number of gradient reductions this rank made, so the gathers stay paired
        with the other ranks' gathers even when one rank made an extra update."""
        ms = _ms()
        if self._gather is None:
            self._gather = ms.ops.AllGather()
        # int64 fingerprints travel as int32 pairs: the exact bits, whatever the backend's dtypes.
        send = np.asarray(values, dtype=np.int64).view(np.int32)
        out = self._gather(ms.Tensor(send)).asnumpy()
        return np.ascontiguousarray(out.astype(np.int32)).view(np.int64).reshape(self.world_size, len(values))

    def _check(self, param_fp: int, opt_fp: int, tensor_fps: list[int], train_mode: str, config_fp: int) -> None:
        assert self.writer is not None  # step() returns early without one
        mode_fp = ids_fingerprint(np.frombuffer(train_mode.encode(), dtype=np.uint8))
        # The torch probe's row (probe/core/compare.py FIELDS), with what this probe does
        # not observe left 0 on every rank: one compare names what differs, for both.
        posted = {"step": self.step, "backward": self.backward, "param_fp": param_fp, "opt_fp": opt_fp}
        posted.update(config_fp=config_fp, mode=mode_fp)
        try:
            rows = self._allgather([int(posted.get(f, 0)) for f in FIELDS])
        except Exception as exc:
            self.checks_disabled = repr(exc)
            self.writer.write(
                contract.KIND_CHECK,
                rank=self.rank,
                step=self.step,
                status="incomplete",
                what=[],
                ranks=[],
                tensor=None,
                detail={"error": repr(exc)[:500]},
            )
            return
        what, outside = compare([[int(v) for v in row] for row in rows], buffers_must_match=False)
        tensor = None
        if "param" in what:
            # Every rank saw the same gathered rows, so every rank takes this branch: the
            # follow-up gather stays paired.
            try:
                per = self._allgather(tensor_fps)
                for i in range(per.shape[1]):
                    if len(set(per[:, i].tolist())) > 1:
                        tensor = self._params[i].name
                        break
            except Exception as exc:
                self._event("exception", f"probe tensor gather failed: {exc!r}")
        status = "mismatch" if what else "ok"
        detail = {name: rows[:, FIELDS.index(name)].tolist() for name in MS_DETAIL}
        self.writer.write(
            contract.KIND_CHECK,
            rank=self.rank,
            step=self.step,
            status=status,
            what=what,
            ranks=outside,
            tensor=tensor,
            detail=detail,
        )
        if what:
            self._report(what, outside, tensor, detail)

    def _report(self, what: list[str], ranks: list[int], tensor: str | None, detail: dict[str, Any]) -> None:
        """The verdict line, the evidence bundle and the exception, as the torch probe
        (probe/core/verdict.py); heal is torch-only: here it warns."""
        message = mismatch_message(self.step, what, ranks, tensor, self.world_size)
        self._event("mismatch", message)
        if self.rank in (0, *ranks[:1]):
            print_verdict(message)
        if self.on_mismatch in ("dump", "raise"):
            try:
                dump_evidence(
                    self,
                    {"step": self.step, "what": what, "ranks": ranks, "detail": detail, "message": message},
                    tensor,
                )
            except Exception as exc:  # a full disk must not stop the checks
                print(f"syncdoctor: rank {self.rank}: evidence not written: {exc}", file=sys.stderr)
        if self.on_mismatch == "raise":
            raise SyncMismatchError(message)

    @property
    def last_losses(self) -> list[tuple[int, float | None]]:
        """The last losses, oldest first (the evidence bundle)."""
        return list(self._recent_losses)

    def event(self, event: str, message: str) -> None:
        try:
            self._event(event, message)
        except Exception:
            pass

    def close(self, status: str = "ok", message: str = "") -> None:
        if self.writer is None:
            return
        try:
            self.writer.write(
                contract.KIND_END, rank=self.rank, step=self.step, t=time.time(), status=status, message=message
            )
        finally:
            self.writer.close()
            self.writer = None


def _fp16_exact(grads: list[np.ndarray]) -> bool | None:
    """Whether the gradients hold float16 values, as the torch probe decides it (probe/core/precision.py)."""
    return precision.fp16_exact(grads, lambda g: str(g.dtype), lambda g, n: g.reshape(-1)[:n])


def _global_norm(grads: Any) -> float | None:
    if grads is None:
        return None
    try:
        total = 0.0
        for g in grads:
            a = as_numpy(g).astype(np.float64)
            total += float(np.dot(a.reshape(-1), a.reshape(-1)))
        return float(np.sqrt(total))
    except Exception:
        return None


# -----------------------------------------------------------------------------------------
# Model.train
def _callback_base() -> type:
    try:
        # The submodule: when the probe is attached while mindspore.train is still
        # importing (zero-code mode), the package has not bound `Callback` yet.
        from mindspore.train.callback import Callback

        return Callback
    except Exception:  # mindspore missing: the class still imports, it just never runs
        return object


class SyncDoctorCallback(_callback_base()):  # type: ignore[misc]
    """`Model.train(epochs, ds, callbacks=[SyncDoctorCallback(run_dir)])`: records every step.

    Gradients are not reachable from a callback, so grad_norm stays null; parameters,
    optimizer state, the loss, the loss scale and overflow are recorded."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        check_every: int | None = None,
        on_mismatch: str | None = None,
    ) -> None:
        super().__init__()
        self.run_dir, self.check_every, self.on_mismatch = run_dir, check_every, on_mismatch
        self.probe: MindSporeProbe | None = None

    def on_train_begin(self, run_context: Any) -> None:
        try:
            cb = run_context.original_args()
            network = _cb_get(cb, "network")
            # cb_params.network is the user's net (measured, 2.10); the loss is beside it.
            loss_fn = _cb_get(cb, "loss_fn") or find_loss(network)
            # MindSpore spells it "loss_scale_mananger" (sic) in 2.10.
            scaler = _cb_get(cb, "loss_scale_mananger") or _cb_get(cb, "loss_scale_manager")
            dataset = _cb_get(cb, "train_dataset")
            batch = None
            try:
                batch = int(dataset.get_batch_size()) * rank_and_size()[1]
            except Exception:
                pass
            optimizer = _cb_get(cb, "optimizer")
            if W.need_init:
                take_init()
            init_fp = next((fp for ref, fp in W.optimizers if ref() is optimizer), None)
            mode = "GRAPH" if _ms().get_context("mode") == _ms().GRAPH_MODE else "PyNative"
            sink = _cb_get(cb, "dataset_sink_mode")
            style = f"Model.train ({mode}, dataset_sink_mode={sink})"
            reducer = pick_reducer(optimizer, [n for n in (_cb_get(cb, "train_network"),) if n is not None])
            seen_stages = stages(
                compiled="Model.train's callback sees no gradients: they stay inside its train network",
                data=None if sink else "the batches Model.train drew from the dataset iterator",
                no_data="dataset_sink_mode=True: the batches go to the device without Python's iterator",
                loss="Model.train's net_outputs",
                reducer=reducer_settings(reducer),
                grads_local=False,
                grads_reduced=False,
                loss_scale=f"{type(scaler).__name__}, and the (loss, overflow, scale) net_outputs"
                if scaler is not None
                else None,
            )
            self.probe = MindSporeProbe(
                network,
                optimizer,
                self.run_dir,
                loss_fn=loss_fn,
                dataset=dataset,
                loss_scaler=scaler,
                # The reducer Model built into its train network (from the parallel context).
                grad_reducer=reducer,
                global_batch=batch,
                check_every=self.check_every,
                on_mismatch=self.on_mismatch,
                init_param_fp=init_fp,
                auto=W.installed,
                extra={"ddp": {"wrapper": "Model.train"}, "style": style, "stages": seen_stages},
            )
            if W.installed:
                print(
                    f"syncdoctor: probe attached on rank {self.probe.rank} to {style}; records in "
                    f"{self.run_dir}/records",
                    file=sys.stderr,
                    flush=True,
                )
        except Exception as exc:  # a broken probe must not stop the run
            print(f"[WARNING] syncdoctor probe disabled: {exc!r}", file=sys.stderr)

    def on_train_step_end(self, run_context: Any) -> None:
        if self.probe is None:
            return
        try:
            cb = run_context.original_args()
            out = _cb_get(cb, "net_outputs")
            overflow, scale = scaled_step_outputs(out)
            optimizer = _cb_get(cb, "optimizer")
            micro, samples, data_fp = take_batches()  # what the dataset iterator handed out (non-sink mode)
            self.probe.after_step(
                loss=out,
                overflow=overflow,
                loss_scale=scale,
                micro=micro,
                samples=samples,
                data_fp=data_fp,
                opt_steps=global_step(optimizer) if optimizer is not None else None,
            )
        except Exception as exc:
            self.probe.event("exception", f"callback step failed: {exc!r}")

    def on_train_end(self, run_context: Any) -> None:
        if self.probe is not None:
            self.probe.close()


def _cb_get(cb: Any, key: str) -> Any:
    """cb_params is a dict whose missing attributes raise KeyError, not AttributeError."""
    try:
        return cb.get(key) if hasattr(cb, "get") else getattr(cb, key, None)
    except Exception:
        return None

"""The live cross-rank check.

Every check step each rank contributes one small int64 vector (counters and
fingerprints) to an asynchronous all_gather on a dedicated gloo group; the result is
read at the next check, so the collective's latency never sits on the training path.
Ranks that are out of step still pair check for check on this group (the k-th check
of every rank meets the others' k-th), which is how a skipped update shows up as a
counter mismatch instead of a deadlock. Every wait is bounded; after one that does
not complete the check stops for good and says so.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from syncdoctor.records.compare import majority_outliers

if TYPE_CHECKING:
    from syncdoctor.probe.core import Probe

MIN_SLACK_STEPS = 4
# The order of the gathered vector. Floats travel as their IEEE bits.
FIELDS = ("step", "backward", "opt_steps", "micro", "param_fp", "opt_fp", "grad_fp",
          "buffer_fp", "data_fp", "config_fp", "mode", "loss_bits", "grad_norm_bits")
N_INT = FIELDS.index("mode")  # the fields taken from the record as they are
MUST_MATCH = ("step", "backward", "opt_steps", "micro", "param_fp", "opt_fp", "grad_fp", "config_fp",
              "mode")
WHAT = {"step": "counter", "backward": "counter", "opt_steps": "counter", "micro": "counter",
        "param_fp": "param", "opt_fp": "opt", "grad_fp": "grad", "buffer_fp": "buffer",
        "config_fp": "config", "mode": "mode"}
# The log line names the most telling difference first.
LABEL = {"param": "parameter", "opt": "optimizer state", "grad": "reduced gradient",
         "buffer": "buffer", "counter": "step counter", "config": "optimizer/loss configuration",
         "mode": "train/eval mode", "data": "duplicate data"}


class SyncMismatchError(RuntimeError):
    """Raised into training only when the user chose on_mismatch='raise'."""


def config_fingerprint(snapshot: dict[str, Any]) -> int:
    """What must be configured alike on every rank: loss and optimizer hyperparameters
    and the DDP settings (not the loader: its rank differs by design)."""
    from syncdoctor.probe.fingerprint import to_int64

    keep = {k: snapshot.get(k) for k in ("loss", "optimizer", "ddp", "groups") if k in snapshot}
    return to_int64(zlib.crc32(json.dumps(keep, sort_keys=True, default=str).encode()) * 0x9E3779B97F4A7C15)


def _float_bits(value: float | None) -> int:
    return 0 if value is None else struct.unpack("<q", struct.pack("<d", float(value)))[0]


def _bits_float(bits: int) -> float | None:
    return None if bits == 0 else struct.unpack("<d", struct.pack("<q", int(bits)))[0]


def compare(table: list[list[int]], buffers_must_match: bool) -> tuple[list[str], list[int]]:
    """What differs across ranks in a gathered table (rows: ranks), and which ranks."""
    column = {f: [row[i] for row in table] for i, f in enumerate(FIELDS)}
    fields = list(MUST_MATCH) + (["buffer_fp"] if buffers_must_match else [])
    what: list[str] = []
    ranks: set[int] = set()
    for name in fields:
        values = column[name]
        if len(set(values)) > 1:
            if WHAT[name] not in what:
                what.append(WHAT[name])
            ranks.update(majority_outliers(dict(enumerate(values))))
    data = [v for v in column["data_fp"] if v]
    duplicates = [v for v, n in Counter(data).items() if n > 1]
    if duplicates:
        what.append("data")
        ranks.update(i for i, v in enumerate(column["data_fp"]) if v in duplicates)
    return what, sorted(ranks)


class CrossRankCheck:
    def __init__(self, probe: Probe, timeout_s: float) -> None:
        self.probe = probe
        self.timeout_s = timeout_s
        self.world_size = probe.world_size
        self.group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        # Collectives in flight, oldest first: (kind, work, outputs, context, index started at).
        self.pending: list[tuple[str, Any, list[torch.Tensor], dict[str, Any], int]] = []
        self.count = 0  # checks submitted
        # A result is read `lag` checks after it was started, at the same check on every
        # rank (so a follow-up gather starts at the same point everywhere), and at least
        # MIN_SLACK_STEPS steps later: with K = 1 the gather's latency on a busy machine
        # would otherwise stall every step.
        self.lag = max(1, math.ceil(MIN_SLACK_STEPS / probe.check_every))
        self.stopped = False
        self.reported: set[tuple[str, ...]] = set()
        self.pending_error: SyncMismatchError | None = None
        # Buffers are compared only where they must match: at forward start under DDP
        # with broadcast_buffers (just broadcast from rank 0). Otherwise a difference is
        # recorded as detail["buffers_differ_unsynced"], not as a mismatch: nothing
        # promised to keep them equal (the doctor judges whether that matters).
        self.buffers_must_match = bool(
            getattr(probe.model, "broadcast_buffers", False) and probe.module is not probe.model
        )

    def submit(self, record: dict[str, Any]) -> None:
        self.count += 1
        self._collect(self.count - self.lag)
        if self.stopped:
            return
        # Not hash(): str hashes are salted per process.
        mode = zlib.crc32(str(record.get("train_mode")).encode())
        vec = torch.tensor([record.get(f) or 0 for f in FIELDS[:N_INT]] + [mode,
                            _float_bits(record.get("loss")), _float_bits(record.get("grad_norm"))],
                           dtype=torch.int64)
        self._start("check", vec, {"record": record, "tensor_fps": list(self.probe._last_tensor_fps),
                                   "grad_fps": list(self.probe._last_grad_fps)})

    def finish(self, timeout_s: float | None = None) -> None:
        """Read what is still in flight, waiting at most `timeout_s` for each."""
        if timeout_s is not None:
            self.timeout_s = timeout_s
        self._collect(None)
        self._collect(None)  # a follow-up started by the last results
        self.stopped = True

    def _start(self, kind: str, vec: torch.Tensor, context: dict[str, Any]) -> None:
        out = [torch.zeros_like(vec) for _ in range(self.world_size)]
        try:
            work = dist.all_gather(out, vec, group=self.group, async_op=True)
        except Exception as exc:
            self._give_up(context.get("step", self.probe.step), exc)
            return
        self.pending.append((kind, work, out, context, self.count))

    def _give_up(self, step: int, exc: BaseException) -> None:
        self.stopped = True
        self.pending.clear()
        self.probe.writer.write("check", rank=self.probe.rank, step=step, status="incomplete",
                                what=[], ranks=[], tensor=None,
                                detail={"error": f"{type(exc).__name__}: {str(exc)[:300]}",
                                        "timeout_s": self.timeout_s})
        print(f"syncdoctor: rank {self.probe.rank}: cross-rank check at step {step} could not "
              f"complete within {self.timeout_s:.0f}s ({type(exc).__name__}); checks stopped",
              file=sys.stderr, flush=True)

    def _collect(self, upto: int | None) -> None:
        """Read the results started at check `upto` or before (None: all). Anything
        started here (a follow-up gather) is read `lag` checks later: never wait on a
        collective that other ranks only reach after their next training step."""
        due = [p for p in self.pending if upto is None or p[4] <= upto]
        self.pending = self.pending[len(due):]  # started in order, so the due ones lead
        for kind, work, out, context, _ in due:
            if self.stopped:
                return
            step = context["record"]["step"] if kind == "check" else context["step"]
            try:
                work.wait(timeout=timedelta(seconds=self.timeout_s))
            except Exception as exc:  # a rank gone or out of step: bounded, then stop checking
                self._give_up(step, exc)
                return
            table = [[int(v) for v in row.tolist()] for row in out]
            if kind == "check":
                self._evaluate(table, context)
            else:
                self._name_tensor(table, context)

    def _evaluate(self, table: list[list[int]], context: dict[str, Any]) -> None:
        step = context["record"]["step"]
        what, ranks = compare(table, self.buffers_must_match)
        detail: dict[str, Any] = {f: [row[i] for row in table] for i, f in enumerate(FIELDS[:N_INT + 1])}
        detail["loss"] = [_bits_float(row[N_INT + 1]) for row in table]
        detail["grad_norm"] = [_bits_float(row[N_INT + 2]) for row in table]
        if len(set(detail["buffer_fp"])) > 1 and not self.buffers_must_match:
            detail["buffers_differ_unsynced"] = True
        if not what:
            # All equal: the per-rank values are in each rank's step records already; an
            # ok record stays small (with K = 1 it is written every step).
            flags = {"buffers_differ_unsynced": True} if detail.get("buffers_differ_unsynced") else {}
            self.probe.writer.write("check", rank=self.probe.rank, step=step, status="ok",
                                    what=what, ranks=ranks, tensor=None, detail=flags)
            return
        self.probe.writer.write("check", rank=self.probe.rank, step=step, status="mismatch",
                                what=what, ranks=ranks, tensor=None, detail=detail)
        follow = {"step": step, "what": what, "ranks": ranks, "detail": detail,
                  "n": len(context["tensor_fps"])}
        if {"param", "grad"} & set(what) and context["tensor_fps"]:
            # Every rank saw this same table, so every rank starts this same gather.
            vec = torch.tensor(context["tensor_fps"] + context["grad_fps"], dtype=torch.int64)
            self._start("tensors", vec, follow)
        else:
            self._report(follow, None)

    def _name_tensor(self, table: list[list[int]], follow: dict[str, Any]) -> None:
        names = [n for n, _ in self.probe._named_params]
        n = follow["n"]
        tensor = None
        for offset in ((0, n) if "param" in follow["what"] else (n,)):
            differing = [i for i in range(n) if len({row[offset + i] for row in table}) > 1]
            if differing:
                tensor = names[differing[0]] + (".grad" if offset else "")
                break
        self.probe.writer.write("check", rank=self.probe.rank, step=follow["step"], status="mismatch",
                                what=follow["what"], ranks=follow["ranks"], tensor=tensor,
                                detail={"follow_up": True})
        self._report(follow, tensor)

    def _report(self, follow: dict[str, Any], tensor: str | None) -> None:
        step, what, ranks = follow["step"], follow["what"], follow["ranks"]
        key = tuple(what)
        first_time = key not in self.reported
        self.reported.add(key)
        message = mismatch_message(step, what, ranks, tensor, self.world_size)
        if first_time and self.probe.rank in (0, *ranks[:1]):
            print(f"syncdoctor: [ERROR] {message}", file=sys.stderr, flush=True)
        if first_time and self.probe.on_mismatch in ("dump", "raise"):
            from syncdoctor.probe.evidence import dump_evidence

            dump_evidence(self.probe, {**follow, "message": message}, tensor)
        if self.probe.on_mismatch == "raise":
            self.pending_error = SyncMismatchError(message)


_ORDER = ("param", "opt", "grad", "counter", "config", "mode", "buffer", "data")


def mismatch_message(step: int, what: list[str], ranks: list[int], tensor: str | None,
                     world_size: int) -> str:
    """`GRADIENT_SYNC: rank 0 and rank 1 parameter mismatch at step 1200 (first: layer3.1.conv2.weight)`,
    then what else differs and every rank outside the majority."""
    ordered = sorted(what, key=lambda w: _ORDER.index(w) if w in _ORDER else len(_ORDER))
    if ordered == ["data"] and len(ranks) >= 2:
        # Not a mismatch: these ranks read the very same batch.
        return (f"GRADIENT_SYNC: rank {ranks[0]} and rank {ranks[1]} consumed identical batches at step {step}; "
                f"ranks with duplicate data: {ranks}")
    majority = [r for r in range(world_size) if r not in ranks]
    pair = f"rank {majority[0] if majority else 0} and rank {ranks[0] if ranks else '?'}"
    where = f" (first: {tensor})" if tensor and ordered[0] in ("param", "grad") else ""
    message = f"GRADIENT_SYNC: {pair} {LABEL[ordered[0]]} mismatch at step {step}{where}"
    if len(ordered) > 1:
        message += "; also differ: " + ", ".join(LABEL[w] for w in ordered[1:])
    return message + f"; ranks out of step: {ranks}"

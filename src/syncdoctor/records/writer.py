"""Append-only JSON-lines writer.

Each record is encoded in full and then written with a single os.write on an
O_APPEND descriptor, so a SIGKILL loses at most the record being written and never
interleaves or corrupts earlier ones. The every-step records of the torch probe go
first to a memory-mapped tail file (records/tail.py), which a kill does not lose
either, and reach the JSON-lines file in one write with the next other record.
Writing never raises into the caller.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path
from typing import Any

import orjson

from syncdoctor import settings
from syncdoctor.records import contract
from syncdoctor.records.constants import SCHEMA_VERSION, records_path
from syncdoctor.records.tail import NO_LOSS, NO_LR, StepTail, format_step, tail_path

_instances = itertools.count()


def _split_nonfinite(fields: dict[str, Any]) -> dict[str, str]:
    """JSON has no NaN/inf: such a top-level float becomes null and is named in
    `nonfinite` ({"loss": "nan"}), so a NaN loss is never silently lost."""
    nonfinite = {
        key: str(value) for key, value in fields.items() if value.__class__ is float and not math.isfinite(value)
    }
    for key in nonfinite:
        fields[key] = None
    return nonfinite


# orjson: a few microseconds less per record than json, on the probe's every-step path.
# It writes nested non-finite floats (a list of norms) as null, never as invalid JSON.
_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


class RecordWriter:
    def __init__(self, run_dir: str | os.PathLike[str], rank: int, *, tail: bool = False) -> None:
        """`tail`: keep step records (`step()`) in a tail file until the next write."""
        self.path = records_path(run_dir, rank)
        self.rank = rank
        self.failed: str | None = None
        self._fd: int | None = None
        self._tail: StepTail | None = None
        self._pid = os.getpid()  # a forked child (a loader worker) writes nothing
        # Validating mode (tests): each record is checked against records/contract.py and
        # what breaks it is written beside the records, never raised into training.
        self.violations_path = (
            self.path.with_suffix(".violations") if os.environ.get(settings.VALIDATE_RECORDS_ENV) == "1" else None
        )
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:  # the probe must never stop training
            self.failed = f"cannot open {self.path}: {exc}"
        if tail and self._fd is not None:
            try:
                self._tail = StepTail(tail_path(run_dir, rank, next(_instances)), rank)
            except (OSError, ValueError):
                pass  # no mapping here: each step record is written at once

    def step(
        self, step: int, micro: int, backward: int, opt_steps: int, t: float, loss: float | None, lr: float | None
    ) -> None:
        """A step record with nothing but counters, time, loss and lr: the probe's
        every-step path, a memory copy into the tail file."""
        absent = 0
        if loss.__class__ is not float or lr.__class__ is not float:  # None, or an int lr
            absent = (NO_LOSS if loss is None else 0) | (NO_LR if lr is None else 0)
            loss, lr = float(loss or 0.0), float(lr or 0.0)
        tail = self._tail
        if tail is None:
            self.write_line(format_step(self.rank, step, micro, backward, opt_steps, t, loss, lr, absent))
        elif tail.put(step, micro, backward, opt_steps, t, loss, lr, absent):
            self.flush()

    def flush(self) -> None:
        """Write the pending step records to the JSON-lines file."""
        if self._tail is not None and self._tail.pending:
            self.write_line(b"")

    def write(self, kind: str, **fields: Any) -> None:
        self.append({"v": SCHEMA_VERSION, "kind": kind, **fields})

    def append(self, record: dict[str, Any]) -> None:
        """Write a record that already holds "v" and "kind" (the probe's every-step path)."""
        if self._fd is None:
            return
        nonfinite = _split_nonfinite(record)
        if nonfinite:
            record["nonfinite"] = nonfinite
        if self.violations_path is not None:
            self._validate(record)
        try:
            line = orjson.dumps(record, default=str, option=_OPTIONS)
        except (TypeError, ValueError):  # an int beyond 64 bits, a lone surrogate: the slow way
            line = (json.dumps(_nulled(record), separators=(",", ":"), default=str) + "\n").encode()
        self.write_line(line)

    def _validate(self, record: dict[str, Any]) -> None:
        broken = contract.violations(record)
        if broken:
            try:
                with open(self.violations_path, "a") as out:  # type: ignore[arg-type]
                    out.writelines(f"{line}\n" for line in broken)
            except OSError:
                pass

    def write_line(self, line: bytes) -> None:
        """Write one already encoded record (with its newline), after the pending
        step records, in one write."""
        if self._fd is None or os.getpid() != self._pid:
            return
        tail = self._tail
        if tail is not None and tail.pending:
            pending = tail.lines()
            pending += line
            line = pending  # type: ignore[assignment]
        try:
            os.write(self._fd, line)
        except OSError as exc:
            self.failed = f"cannot write {self.path}: {exc}"
        if tail is not None and tail.pending:
            tail.mark_flushed()  # after a failed write too: a full disk must not cost a write per step

    def close(self) -> None:
        if self._fd is None or os.getpid() != self._pid:
            return
        self.flush()
        if self._tail is not None:
            try:
                self._tail.close()
            except OSError:
                pass
            self._tail = None
        try:
            os.close(self._fd)
        except OSError:
            pass
        self._fd = None


def _nulled(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _nulled(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulled(v) for v in value]
    return value

"""The tail of a rank's step records: the steps not yet written to its JSON-lines
file, kept in a small memory-mapped file next to it.

Why: the step record is the probe's only every-step write. Measured in the training
loop of a 3 ms MLP step here, one write() system call cost ~15 us (about three times its
isolated cost: after a step of model work the kernel's write path is cold) and
formatting the line ~10 us: together ~0.7% of the step. A store into a shared
file mapping is a memory copy, and it survives SIGKILL and the OOM killer, because the
page belongs to the file, not to the process. The writer appends the pending steps to
the JSON-lines file in one write together with the next record of any other kind (at
every check step), when the tail is full, when its oldest step is FLUSH_AFTER_S old
and at close, after which the tail file is removed. So a tail file is left only by a
rank that is still running or was killed, and the reader adds the steps it holds that
the JSON-lines file lacks (docs/records.md).

Layout, little-endian:
  header, 32 bytes: b"SDTAIL1\\n", rank, slots, flushed (int64; entries already in the
    JSON-lines file)
  `slots` entries of 72 bytes: seq, step, micro, backward, opt_steps (int64), t, loss,
    lr (float64), absent (int64: 1 = no loss, 2 = no lr)
The i-th pending entry (from 0) counts when its seq is flushed + i + 1. Seq is stored
after the rest of the entry, so an entry cut short by a kill is never read.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from pathlib import Path

from syncdoctor.records.constants import RECORDS_SUBDIR, SCHEMA_VERSION

MAGIC = b"SDTAIL1\n"
TAIL_SLOTS = 256  # steps between two writes at most (20 KB of file)
FLUSH_AFTER_S = 2.0  # slow steps: the JSON-lines file lags by at most this much
_HEADER = struct.Struct("<8sqqq")
_SEQ = struct.Struct("<q")
_BODY = struct.Struct("<qqqqdddq")  # step, micro, backward, opt_steps, t, loss, lr, absent
_ENTRY = struct.Struct("<qqqqqdddq")  # seq, then the body
SLOT = _ENTRY.size
_FLUSHED_AT = _HEADER.size - 8
NO_LOSS, NO_LR = 1, 2

# C formatting: %.17g gives back the very same float when read, and is faster than repr.
_STEP_LINE = (
    b'{"v":%d,"kind":"step","rank":%%d,"step":%%d,"micro":%%d,"backward":%%d,"opt_steps":%%d,'
    b'"t":%%.6f,"loss":%%.17g,"lr":%%.17g}\n' % SCHEMA_VERSION
)
_STEP_LINE_ANY = (
    b'{"v":%d,"kind":"step","rank":%%d,"step":%%d,"micro":%%d,"backward":%%d,"opt_steps":%%d,'
    b'"t":%%.6f,"loss":%%s,"lr":%%s%%s}\n' % SCHEMA_VERSION
)
KEY_END = b',"loss":'  # a step line up to here names it: rank, step, counters, time


def format_step(
    rank: int, step: int, micro: int, backward: int, opt_steps: int, t: float, loss: float, lr: float, absent: int
) -> bytes:
    """One step record, as the writer's general path would write it (a value JSON
    cannot carry becomes null and is named in "nonfinite")."""
    if not absent and loss - loss == 0.0 and lr - lr == 0.0:
        return _STEP_LINE % (rank, step, micro, backward, opt_steps, t, loss, lr)
    values, nonfinite = [], []
    for name, value, missing in (("loss", loss, absent & NO_LOSS), ("lr", lr, absent & NO_LR)):
        if missing or not math.isfinite(value):
            values.append(b"null")
            if not missing:
                nonfinite.append(b'"%s":"%s"' % (name.encode(), str(value).encode()))
        else:
            values.append(b"%.17g" % value)
    extra = b',"nonfinite":{' + b",".join(nonfinite) + b"}" if nonfinite else b""
    return _STEP_LINE_ANY % (rank, step, micro, backward, opt_steps, t, values[0], values[1], extra)


def tail_path(run_dir: str | os.PathLike[str], rank: int, instance: int) -> Path:
    return Path(run_dir) / RECORDS_SUBDIR / f"rank{rank}.{os.getpid()}.{instance}.tail"


class StepTail:
    """The writer's side: entries are stored from slot 0 after every flush."""

    def __init__(self, path: Path, rank: int, slots: int = TAIL_SLOTS) -> None:
        self.path, self.rank, self.slots = path, rank, slots
        size = _HEADER.size + slots * SLOT
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            # Written, not a sparse ftruncate: a store into a page the file system has no
            # room for raises SIGBUS, which would end training; a full disk fails here.
            if os.write(fd, bytes(size)) != size:
                raise OSError("short write")
            self._map = mmap.mmap(fd, size)  # shared: the file's own pages
        finally:
            os.close(fd)  # the mapping keeps the file open
        _HEADER.pack_into(self._map, 0, MAGIC, rank, slots, 0)
        self.flushed = 0
        self.pending = 0
        self.flush_by = math.inf  # when the oldest pending step is FLUSH_AFTER_S old
        self._body, self._seq = _BODY.pack_into, _SEQ.pack_into

    def put(
        self, step: int, micro: int, backward: int, opt_steps: int, t: float, loss: float, lr: float, absent: int
    ) -> bool:
        """Store one step; True when the pending steps should be written now."""
        pending = self.pending
        if not pending:
            self.flush_by = t + FLUSH_AFTER_S
        offset = _HEADER.size + pending * SLOT
        self._body(self._map, offset + _SEQ.size, step, micro, backward, opt_steps, t, loss, lr, absent)
        self.pending = pending = pending + 1
        self._seq(self._map, offset, self.flushed + pending)  # last: the entry now counts
        return pending == self.slots or t > self.flush_by

    def lines(self) -> bytearray:
        """The pending entries as JSON lines (grown in place: the probe's extra memory
        stays about the size of the lines)."""
        out = bytearray()
        with memoryview(self._map) as view:
            for entry in _ENTRY.iter_unpack(view[_HEADER.size : _HEADER.size + self.pending * SLOT]):
                out += format_step(self.rank, *entry[1:])
        return out

    def mark_flushed(self) -> None:
        self.flushed += self.pending
        self.pending = 0
        _SEQ.pack_into(self._map, _FLUSHED_AT, self.flushed)

    def close(self) -> None:
        """After a flush: the tail holds nothing the JSON-lines file lacks."""
        try:
            self._map.close()
        finally:
            self.path.unlink(missing_ok=True)


def read_tail(path: Path) -> tuple[int, list[bytes]]:
    """The rank and the pending step lines of a tail file. Raises ValueError when it
    is not one (foreign or damaged header); entries after the first that does not
    count (cut by a kill, or from an earlier round) are not read."""
    data = path.read_bytes()
    if len(data) < _HEADER.size:
        raise ValueError("shorter than its header")
    magic, rank, slots, flushed = _HEADER.unpack_from(data, 0)
    if magic != MAGIC or not 0 < slots <= 1 << 20 or rank < 0 or flushed < 0:
        raise ValueError("not a syncdoctor tail file")
    lines = []
    count = min(slots, (len(data) - _HEADER.size) // SLOT)
    for i, (seq, *body) in enumerate(_ENTRY.iter_unpack(data[_HEADER.size : _HEADER.size + count * SLOT])):
        if seq != flushed + i + 1:
            break
        lines.append(format_step(rank, *body))
    return rank, lines

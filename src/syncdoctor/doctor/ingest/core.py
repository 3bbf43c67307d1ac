"""Reading raw logs into per-rank loss series and communication/process events."""

from __future__ import annotations

import heapq
import json
import math
import os
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain, pairwise, repeat
from typing import Any, cast

import numpy as np
import polars as pl

from syncdoctor.doctor.ingest import events as ev
from syncdoctor.doctor.ingest.fields import detect_host_labels, detect_srun_labels, parse_time, strip_prefixes
from syncdoctor.doctor.ingest.files import SNIFF_BYTES, LogFile, discover, looks_binary, open_binary
from syncdoctor.doctor.ingest.losses import LossParser, LossPoint, global_steps, point_columns, split_records
from syncdoctor.doctor.ingest.scan import (
    HEAD_ROWS,
    MAX_LINE_BYTES,
    PARSE_CHARS,
    TAIL_ROWS,
    Chunk,
    TolerantStream,
    iter_chunks,
)
from syncdoctor.doctor.ingest.shapes import (
    FAST_MIN_LINES,
    Numbers,
    ShapePlan,
    build_plan,
    cut_numbers,
    fast_pool,
    qualifies,
    shape_counts,
)
from syncdoctor.doctor.ingest.values import STEP_KEYS, fast_spans, line_values
from syncdoctor.doctor.model import Event
from syncdoctor.errors import InputError
from syncdoctor.records.contract import int64_or_none

RAW_CHARS = 2000  # Event.raw keeps this much of a line
EVENTS_HEAD = 200  # per (kind, rank, benign): the first ones ...
EVENTS_TAIL = 50  # ... and the last ones, which hold the end of a run
TRAINER_STATE_MAX_BYTES = 256 << 20

LOSS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "loss": pl.Float64(),
    "epoch": pl.Float64(),
    "lr": pl.Float64(),
    "grad_norm": pl.Float64(),
    "source": pl.String(),
    "line": pl.Int64(),
    "acc": pl.Float64(),
}
# Every key -> number pair of the lines that hold a loss, a step or an event
# (ingest/values.py), with the step it was printed at: the cross-rank comparison
# of what must be equal reads it. ``step`` is the step the line printed (global,
# like the losses'), null where it printed none.
VALUES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "key": pl.String(),
    "value": pl.Float64(),
    "source": pl.String(),
    "line": pl.Int64(),
}
MAX_VALUE_LINES = 200_000  # per file: enough to find where ranks part, bounded memory
MAX_SHAPE_PLANS = 4096  # per file, like the other memos of line shapes
# The shape fast path (ingest/shapes.py); off, every line takes the full path (the
# unit tests compare the two).
FAST_SHAPES = True
# Columns used while reading, dropped from the result.
_WORK_SCHEMA: dict[str, pl.DataType] = {
    **LOSS_SCHEMA,
    "step_total": pl.Int64(),
    "_t": pl.Float64(),
    "_file": pl.Int64(),
}


@dataclass
class LogData:
    """What the logs hold, for the doctor's analyses.

    ``losses``: one row per printed training loss, columns rank (null when no rank
    could be told), step (global, monotonically increasing per rank and file when
    the log restarts its counter each epoch), loss (NaN/inf kept), epoch, lr,
    grad_norm, source, line, acc.
    ``events``: communication and process events in file order (files in the
    order of ``files``, lines ascending); sort by ``Event.t`` where set to get the
    cluster-wide order (needed to find the first failing rank: msrun's scheduler
    names the node it killed, not the one that died).
    """

    losses: pl.DataFrame
    events: list[Event] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    values: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=VALUES_SCHEMA))
    # files whose rank could not be told (no prefix, no rank field, no rank in the name)
    unranked: list[str] = field(default_factory=list)
    n_lines: int = 0  # lines read, all files


class _EventStore:
    """Keeps the first EVENTS_HEAD and last EVENTS_TAIL events of each
    (kind, rank, benign), so a flood (NCCL retries, a watchdog per collective)
    cannot exhaust memory; what was dropped is counted."""

    def __init__(self) -> None:
        self.head: dict[tuple[str, int | None, bool], list[tuple[int, int, Event]]] = {}
        self.tail: dict[tuple[str, int | None, bool], deque[tuple[int, int, Event]]] = {}
        self.total: Counter[tuple[str, int | None, bool]] = Counter()

    def add(self, file_index: int, event: Event) -> None:
        key = (event.kind, event.rank, event.benign)
        self.total[key] += 1
        item = (file_index, event.line or 0, event)
        head = self.head.setdefault(key, [])
        if len(head) < EVENTS_HEAD:
            head.append(item)
        else:
            self.tail.setdefault(key, deque(maxlen=EVENTS_TAIL)).append(item)

    def events(self) -> list[tuple[int, Event]]:
        items = [it for h in self.head.values() for it in h] + [it for t in self.tail.values() for it in t]
        items.sort(key=lambda it: (it[0], it[1]))
        return [(f, e) for f, _, e in items]

    def dropped(self) -> list[str]:
        out = []
        for (kind, rank, benign), n in sorted(self.total.items(), key=lambda kv: str(kv[0])):
            kept = len(self.head.get((kind, rank, benign), ())) + len(self.tail.get((kind, rank, benign), ()))
            if n > kept:
                who = "unknown rank" if rank is None else f"rank {rank}"
                what = f"benign {kind}" if benign else kind
                out.append(
                    f"{n - kept} more {what} events of {who} not kept "
                    f"(the first {EVENTS_HEAD} and last {EVENTS_TAIL} of {n} are)"
                )
        return out


# A line's values as kept: (rank, line, printed step or None, {key: value}, has a loss point)
_ValueLine = tuple[int | None, int, int | None, dict[str, float], bool]


@dataclass
class _FastBlock:
    """What the shape fast path adds for a chunk's lines of one planned shape, as
    columns: per loss point, _WORK_SCHEMA's columns but "source", "_t" and "_file";
    per line, its values line (None: none) and timestamp (filled in file order)."""

    plan: ShapePlan
    line_nos: list[int]
    points: list[dict[str, list[Any]]]
    entries: list[_ValueLine | None]
    times: list[float | None]
    kept: list[bool]  # the line was read (not taken by a torchrun block before it)


# The fast path's share of a chunk's scan: (shape, lines) counts, the plans used, the numbers cut
_Prepared = tuple[list[tuple[str, int]], dict[str, ShapePlan], Numbers]


def _floats_or_nan(texts: list[str]) -> list[float]:
    """float() of each text, NaN where float() refuses one (as line_values reads)."""
    try:
        return list(map(float, texts))
    except ValueError:
        out = []
        for text in texts:
            try:
                out.append(float(text))
            except ValueError:
                out.append(math.nan)
        return out


class _FileReader:
    """Reads one log file: loss rows into small frames, events into the store."""

    def __init__(self, log: LogFile, index: int, store: _EventStore, warnings: list[str]) -> None:
        self.log = log
        self.index = index
        self.store = store
        self.warnings = warnings
        self.frames: list[pl.DataFrame] = []
        self.rows: list[tuple[object, ...]] = []  # in _WORK_SCHEMA column order
        self.fast_frames: list[pl.DataFrame] = []  # the fast path's rows of the chunk
        self.lines_read = 0
        self.parser = LossParser()
        self.formats: Counter[str] = Counter()
        self.n_events = 0
        self.year_hint: int | None = None
        self.srun_labels = False
        self.host_labels = False
        self.consumed: set[int] = set()
        self.consumed_by: dict[int, int] = {}  # consumed line -> the (first) event line that took it
        self.timed_shapes: dict[str, bool] = {}  # loss-line shape -> carries a timestamp
        self.value_lines: list[_ValueLine] = []
        self.value_lines_dropped = 0
        self.plans: dict[str, ShapePlan | None] = {}  # shape -> its fast path; None: never
        self.fast_lines = 0  # lines read by the shape fast path

    # -- reading ----------------------------------------------------------------------
    def read(self) -> bool:
        """Read the file; False when it was skipped (binary)."""
        try:
            self.year_hint = time.gmtime(os.stat(self.log.path).st_mtime).tm_year
        except OSError:
            self.year_hint = None
        with open_binary(self.log.path) as stream:
            head = stream.read(SNIFF_BYTES)
            if not head:
                self.warnings.append(f"{self.log.source}: empty file")
                return True
            if looks_binary(head):
                if not self.log.explicit:
                    self.warnings.append(f"{self.log.source}: skipped, looks binary")
                    return False
                self.warnings.append(f"{self.log.source}: looks binary; read anyway as text")
            stream.seek(0)
            source = TolerantStream(stream) if self.log.compressed else stream
            first = True
            last: Chunk | None = None
            prepare = self._prepare if FAST_SHAPES else None
            for chunk in iter_chunks(source, anchors=ev.ANCHORS, prepare=prepare):
                last = chunk
                if first:
                    head_lines = chunk.frame["l"].head(200).to_list()
                    self.srun_labels = detect_srun_labels(head_lines)
                    self.host_labels = not self.srun_labels and detect_host_labels(head_lines)
                    first = False
                self._chunk(chunk)
                self.lines_read = chunk.first_line + chunk.n_lines - 1
                self.warnings.extend(
                    f"{self.log.source}:{line}: line longer than {MAX_LINE_BYTES >> 20} MiB; only its start was read"
                    for line in chunk.long_lines
                )
                self._flush()
            if last is not None:
                self._tail(last)
            if isinstance(source, TolerantStream) and source.error is not None:
                self.warnings.append(
                    f"{self.log.source}: truncated or corrupt compressed log, read up to line "
                    f"{self.lines_read} ({source.error})"
                )
        return True

    def _chunk(self, chunk: Chunk) -> None:
        blocks = self._fast_groups(chunk) if FAST_SHAPES else []
        # Lines of a planned shape are read in bulk (_fast_rows); the loop below visits
        # only those whose reading depends on the lines before them: a timestamp (glog
        # stamps take the year of the last full one), or all of them where the values
        # cap may be reached in this chunk. The others' values lines are merged in line
        # order afterwards (_merge_fast), which gives the same list.
        in_order = len(self.value_lines) + len(chunk.lines) >= MAX_VALUE_LINES
        fast: dict[int, tuple[_FastBlock, int]] = {}
        later: set[int] = set()
        for block in blocks:
            fast.update(zip(block.line_nos, zip(repeat(block), range(len(block.line_nos))), strict=False))
            if not (in_order or block.plan.timed):
                later.update(block.line_nos)
        values_from = len(self.value_lines)
        for line_no, text, eventish, anchors in zip(
            chunk.lines, chunk.texts, chunk.eventish, chunk.anchors, strict=True
        ):
            if line_no in later:
                continue
            if not text or line_no in self.consumed:
                continue
            if fast:
                item = fast.get(line_no)
                if item is not None:
                    self._fast_line(*item, text)
                    continue
            line = text[:PARSE_CHARS]
            prefix = strip_prefixes(line, self.srun_labels, self.host_labels)
            body = prefix.body
            low = body.lower()
            t: float | None = None
            valued = False
            if "loss" in low or "step" in low:
                records = split_records(body) if "\r" not in text else [body]
                if len(records) > 1:
                    self._glued_records(records, prefix.rank, line_no)
                    valued = True  # several ranks' values on one line: not read as one record
                else:
                    points = self._loss_points(text, body)
                    if points:
                        t = self._loss_time(body)
                        for point in points:
                            self._add_loss(point, prefix.rank, line_no, t)
                        last = points[-1]
                        if "\r" not in text:
                            self._add_values(
                                body,
                                prefix.rank,
                                line_no,
                                last.rank,
                                last.step is not None,
                                True,
                                self.parser.last_shape,
                                self.parser.last_pos,
                            )
                        valued = True
            if not valued and ("step" in low or line_no <= HEAD_ROWS):
                self._add_values(body, prefix.rank, line_no, None, True, False)
                valued = True
            # DeepSpeed's "step=2000, skipped=1995" carries only the step keyword,
            # yet its skip counter is the loss scaler's record of overflows.
            if eventish or "skipped=" in low:
                # the anchors the scan found in the line are those its body holds and
                # more, unless stripping the prefixes spliced the body ("[rank0]:" cut out)
                match = ev.classify(body, low, anchors if anchors is not None and line.endswith(body) else None)
                if match is not None and match.rule.kind is not None:
                    if t is None:
                        t = self._time(body)
                    self._add_event(match, chunk, line_no, text, prefix.rank, prefix.host, t)
                    if not valued:  # the numbers an event line states ("scale is small: 1e-26")
                        self._add_values(body, prefix.rank, line_no, None, True, False)
        if blocks:
            self._merge_fast(blocks, later, values_from)

    def _merge_fast(self, blocks: list[_FastBlock], later: set[int], values_from: int) -> None:
        """The fast path's share of a chunk once its loop is done: the lines not
        visited are read unless a torchrun block before them took them (as the loop
        would have skipped them), their values lines go in line order among the
        chunk's, and every read line's loss rows become one frame."""
        merged: list[_ValueLine] = []
        for block in blocks:
            for k, line_no in enumerate(block.line_nos):
                if line_no in later:
                    taken = self.consumed_by.get(line_no)
                    if taken is None or taken > line_no:
                        block.kept[k] = True
                        entry = block.entries[k]
                        if entry is not None:
                            merged.append(entry)
        if merged:
            merged.sort(key=lambda entry: entry[1])
            self.value_lines[values_from:] = list(
                heapq.merge(self.value_lines[values_from:], merged, key=lambda e: e[1])
            )
        for block in blocks:
            n, n_kept = len(block.line_nos), sum(block.kept)
            if not n_kept:
                continue
            self.fast_lines += n_kept
            for (fmt, _), point in zip(block.plan.points, block.points, strict=True):
                self.formats[fmt] += n_kept  # its first line went the full way: no new key
                columns = {
                    **point,
                    "source": [self.log.source] * n,
                    "line": block.line_nos,
                    "_t": block.times,
                    "_file": [self.index] * n,
                }
                frame = pl.DataFrame({name: columns[name] for name in _WORK_SCHEMA}, schema=_WORK_SCHEMA, strict=False)
                self.fast_frames.append(frame if n_kept == n else frame.filter(pl.Series(block.kept)))

    def _plan(self, shape: str) -> ShapePlan | None:
        """The fast path of a shape once its first line went the full way (the loss
        parser's, the timestamp's and the values' memos all hold it); None before."""
        if shape in self.plans:
            return self.plans[shape]
        plan: ShapePlan | None = None
        if qualifies(shape, self.srun_labels, self.host_labels):
            specs = self.parser.known(shape)
            timed = self.timed_shapes.get(shape)
            spans = fast_spans(shape)
            if specs is None or timed is None or spans is None:
                return None  # not read yet (or a memo is full): the full path
            plan = build_plan(shape, specs, spans, timed) if specs else None
        if len(self.plans) < MAX_SHAPE_PLANS:
            self.plans[shape] = plan
        return plan

    def _prepare(self, cand: pl.DataFrame) -> _Prepared:
        """The fast path's polars work on a chunk's candidates, run on the scan's
        thread (polars releases the GIL meanwhile): the shapes' counts, and the
        numbers of the lines whose shape already has a plan (``self.plans`` is only
        read here; shapes planned later are cut on the main thread)."""
        pool = fast_pool(cand)
        if pool.is_empty():
            return [], {}, {}
        counts = shape_counts(pool)
        known: dict[str, ShapePlan] = {}
        for shape, n in counts:
            plan = self.plans.get(shape) if n >= FAST_MIN_LINES else None
            if plan is not None:
                known[shape] = plan
        return counts, known, cut_numbers(pool, known) if known else {}

    def _fast_groups(self, chunk: Chunk) -> list[_FastBlock]:
        """What the full path would add for the chunk's lines whose shape has a plan:
        one regex per shape cuts the numbers out, and the rows are built a column at
        a time (per line, only what depends on the order of lines is left: timestamps,
        the values cap, lines a torchrun block took; see _chunk)."""
        cand = chunk.candidates
        if cand is None or cand.is_empty():
            return []
        prepared = cast("_Prepared | None", chunk.prepared)
        counts, known, numbers = prepared if prepared is not None else self._prepare(cand)
        todo: dict[str, ShapePlan] = {}
        for shape, n in counts:
            if n >= FAST_MIN_LINES and shape not in known and (plan := self._plan(shape)) is not None:
                todo[shape] = plan
        if todo:
            known = {**known, **todo}
            numbers = {**numbers, **cut_numbers(fast_pool(cand), todo)}
        return [
            self._fast_rows(known[shape], [chunk.first_line + i for i in rows], columns)
            for shape, (rows, columns) in numbers.items()
        ]

    def _fast_rows(self, plan: ShapePlan, line_nos: list[int], columns: list[list[str]]) -> _FastBlock:
        """What the full path adds for lines of a planned shape, from the texts of
        their numbers (column g: group g of the shape's regex), as columns: the same
        loss rows (but their timestamp and file), values lines."""
        n = len(line_nos)
        none = [None] * n
        points: list[dict[str, list[Any]]] = []
        last: dict[str, list[Any]] = {}
        for _fmt, fields in plan.points:
            point = point_columns(
                [(name, columns[g], None if tg is None else columns[tg]) for name, g, tg in fields], n
            )
            points.append(
                {
                    # no launcher prefix: the shape peels none
                    "rank": [int64_or_none(r if r is not None else self.log.rank) for r in point.get("rank", none)],
                    "step": [int64_or_none(step) for step in point.get("step", none)],
                    **{
                        name: point.get(name, none)
                        for name in ("loss", "epoch", "lr", "grad_norm", "acc", "step_total")
                    },
                }
            )
            last = point
        keys = [key for key, _ in plan.values]
        value_columns = [_floats_or_nan(columns[g]) for _, g in plan.values]
        line_ranks = last.get("rank", none)
        printed = [step is not None for step in last.get("step", none)]
        entries: list[_ValueLine | None] = [None] * n
        if keys:
            file_rank = self.log.rank
            rows = zip(line_nos, line_ranks, printed, zip(*value_columns, strict=True), strict=True)
            for k, (line_no, rank, step, row) in enumerate(rows):
                values = dict(zip(keys, row, strict=True))
                if step and (rank is not None or "rank" not in values):
                    # what _value_entry gives a loss line with its own step, in short
                    entries[k] = (rank if rank is not None else file_rank, line_no, None, values, True)
                else:
                    entries[k] = self._value_entry(values, None, line_no, rank, step, True)
        return _FastBlock(plan, line_nos, points, entries, [None] * n, [False] * n)

    def _fast_line(self, block: _FastBlock, k: int, text: str) -> None:
        """Read the k-th line of a fast block in file order: its timestamp, its values line."""
        if block.plan.timed:
            block.times[k] = self._time(text)
        block.kept[k] = True
        if len(self.value_lines) >= MAX_VALUE_LINES:
            self.value_lines_dropped += 1
        elif (entry := block.entries[k]) is not None:
            self.value_lines.append(entry)

    def _tail(self, chunk: Chunk) -> None:
        """The last lines of a file are read for values whatever they hold: what each
        rank prints once at the end (a final evaluation, a summary) is compared
        across ranks, like what it prints once at start."""
        start = max(chunk.n_lines - TAIL_ROWS, 0)
        candidates = set(chunk.lines)
        rows = chunk.frame["l"].slice(start).to_list()
        for i, text in enumerate(rows):
            line_no = chunk.first_line + start + i
            if not text or line_no in candidates or line_no <= HEAD_ROWS:
                continue
            prefix = strip_prefixes(text[:PARSE_CHARS], self.srun_labels, self.host_labels)
            self._add_values(prefix.body, prefix.rank, line_no, None, True, False)

    def _add_values(
        self,
        body: str,
        prefix_rank: int | None,
        line_no: int,
        line_rank: int | None,
        printed_step: bool,
        has_loss: bool,
        shape: str | None = None,
        pos: Callable[[int], int] | None = None,
    ) -> None:
        if len(self.value_lines) >= MAX_VALUE_LINES:
            self.value_lines_dropped += 1
            return
        values = line_values(body, shape, pos)
        entry = self._value_entry(values, prefix_rank, line_no, line_rank, printed_step, has_loss)
        if entry is not None:
            self.value_lines.append(entry)

    def _value_entry(
        self,
        values: dict[str, float],
        prefix_rank: int | None,
        line_no: int,
        line_rank: int | None,
        printed_step: bool,
        has_loss: bool,
    ) -> _ValueLine | None:
        """The values line kept for a line's values, or None where none is."""
        if not values:
            return None
        step: int | None = None
        if not has_loss or not printed_step:
            # the step the line prints under any name; a line with a loss and no step
            # of its own is numbered by the order of lines: not comparable across ranks
            raw = next((values[k] for k in STEP_KEYS if k in values), None)
            step = int(raw) if raw is not None and math.isfinite(raw) and 0 <= raw < 2**62 else None
            if has_loss and step is None:
                return None
            has_loss = False
        rank = prefix_rank if prefix_rank is not None else line_rank
        said = values.get("rank")
        if rank is None and said is not None and 0 <= said < 1e7 and said == int(said):  # NaN fails 0 <= said
            rank = int(said)
        rank = rank if rank is not None else self.log.rank
        return (rank, line_no, step, values, has_loss)

    def value_frame(self, losses: pl.DataFrame | None) -> pl.DataFrame | None:
        """The values rows, each at its line's global step (the loss rows' where the
        line held a loss, else the step it printed)."""
        if not self.value_lines:
            return None
        at: dict[int, int] = {}
        if losses is not None:
            lines_steps = zip(losses["line"].to_list(), losses["step"].to_list(), strict=True)
            at = {line: step for line, step in lines_steps if step is not None}
        if self.value_lines_dropped:
            self.warnings.append(
                f"{self.log.source}: values of the first {MAX_VALUE_LINES} lines kept for the cross-rank "
                f"comparison, {self.value_lines_dropped} more not read"
            )
        # One row per line, then repeated once per value it holds: building the
        # rows key by key in Python cost a tenth of reading a large log.
        ranks, lines, steps, held, has_loss = zip(*self.value_lines, strict=True)
        per_line = pl.DataFrame(
            {
                "rank": [int64_or_none(rank) for rank in ranks],
                "step": [
                    at.get(line) if loss else step for line, step, loss in zip(lines, steps, has_loss, strict=True)
                ],
                "line": lines,
            },
            schema={name: VALUES_SCHEMA[name] for name in ("rank", "step", "line")},
            strict=False,
        )
        counts = pl.Series(list(map(len, held)), dtype=pl.UInt32)
        keys = list(chain.from_iterable(held))
        vals = list(chain.from_iterable(values.values() for values in held))
        # The row index repeated in polars: a numpy index would be converted through
        # numpy.ma, whose first import costs a tenth of a second where bytecode is not
        # cached. A line's values are never empty (_value_entry), so no list is.
        rows = pl.select(pl.int_range(per_line.height, dtype=pl.UInt32).repeat_by(counts).explode()).to_series()
        return per_line[rows].select(
            "rank",
            "step",
            pl.Series("key", keys, dtype=pl.String),
            pl.Series("value", vals, dtype=pl.Float64, strict=False),
            pl.lit(self.log.source, dtype=pl.String).alias("source"),
            "line",
        )

    def _glued_records(self, records: list[str], line_rank: int | None, line_no: int) -> None:
        """Several ranks' records on one line: each keeps its own rank (its launcher
        tag, else its rank field); the line's own tag belongs to the first only."""
        for i, record in enumerate(records):
            prefix = strip_prefixes(record, False)
            rank = prefix.rank if prefix.rank is not None else (line_rank if i == 0 else None)
            for point in self.parser.parse(prefix.body):
                if rank is None and point.rank is None and i > 0:
                    continue  # a glued record of an unknown rank: not this file's rank
                self._add_loss(point, rank, line_no, None)

    def _loss_points(self, text: str, body: str) -> list[LossPoint]:
        if "\r" not in text:
            return self.parser.parse(body)
        # tqdm/Keras redraw with "\r": one line holds many updates.
        points: list[LossPoint] = []
        for segment in text.split("\r"):
            for point in self.parser.parse(segment[:PARSE_CHARS]):
                if not points or (points[-1].step, points[-1].loss) != (point.step, point.loss):
                    points.append(point)
        return points

    def _loss_time(self, body: str) -> float | None:
        # Loss lines of one shape either all carry a timestamp or none does: look
        # for one only in shapes that had one the first time.
        shape = self.parser.last_shape
        timed = self.timed_shapes.get(shape)
        if timed is False:
            return None
        t = self._time(body)
        if timed is None and len(self.timed_shapes) < 4096:
            self.timed_shapes[shape] = t is not None
        return t

    def _time(self, body: str) -> float | None:
        t, year = parse_time(body, self.year_hint)
        if year is not None:
            self.year_hint = year
        return t

    def _add_loss(self, p: LossPoint, prefix_rank: int | None, line_no: int, t: float | None) -> None:
        # A launcher prefix is the most reliable, then the line's own rank field,
        # then the file name.
        rank = prefix_rank if prefix_rank is not None else p.rank if p.rank is not None else self.log.rank
        self.rows.append(
            (
                int64_or_none(rank),
                int64_or_none(p.step),
                p.loss,
                p.epoch,
                p.lr,
                p.grad_norm,
                self.log.source,
                line_no,
                p.acc,
                p.step_total,
                t,
                self.index,
            )
        )
        self.formats[p.fmt] += 1

    def _add_event(
        self,
        match: ev.Match,
        chunk: Chunk,
        line_no: int,
        text: str,
        prefix_rank: int | None,
        prefix_host: str | None,
        t: float | None,
    ) -> None:
        rule = match.rule
        raw = text[:RAW_CHARS]
        rank, host = match.rank, match.host
        if rule.name == "torchrun_block":
            block = ev.read_torchrun_block(chunk.context(line_no, 6, 6), line_no)
            self.consumed.update(block.lines)
            for taken in block.lines:
                self.consumed_by.setdefault(taken, line_no)
            raw, rank, host = block.raw[:RAW_CHARS], block.rank, block.host
            if block.time_text:
                t = self._time(block.time_text)
        # The rank a line is about, then the launcher's tag, then the file name,
        # then whatever rank the message names for its writer.
        for candidate in (prefix_rank, self.log.rank, match.inrank):
            if rank is None:
                rank = candidate
        event = Event(
            kind=rule.kind or "info",
            raw=raw,
            source=self.log.source,
            line=line_no,
            rank=rank,
            host=host or prefix_host or self.log.host,
            t=t,
            benign=rule.benign,
        )
        self.store.add(self.index, event)
        self.n_events += 1

    def _flush(self) -> None:
        frames = self.fast_frames
        if self.rows:
            # column by column: polars builds a frame from lists twice as fast as from row tuples
            columns = list(zip(*self.rows, strict=True))
            frames = [pl.DataFrame(columns, schema=_WORK_SCHEMA, orient="col", strict=False), *frames]
        if not frames:
            return
        if len(frames) == 1:
            self.frames.append(frames[0])
        else:
            # the fast path's rows among the others in file order (a line's rows all come
            # from one path, in their order: the sort is stable)
            self.frames.append(pl.concat(frames).sort("line", maintain_order=True))
        self.rows = []
        self.fast_frames = []

    # -- results ------------------------------------------------------------------------
    def loss_frame(self) -> pl.DataFrame | None:
        self._flush()
        if not self.frames:
            return None
        frame = pl.concat(self.frames)
        ranks = frame["rank"].to_list()
        steps = frame["step"].to_list()
        totals = frame["step_total"].to_list()
        epochs = frame["epoch"].to_list()
        lines = frame["line"].to_list()
        out = [0] * frame.height
        groups: dict[int | None, list[int]] = {}
        for i, rank in enumerate(ranks):
            groups.setdefault(rank, []).append(i)
        for rank, idx in groups.items():
            result = global_steps(
                [steps[i] for i in idx],
                [totals[i] for i in idx],
                [epochs[i] for i in idx],
                [lines[i] for i in idx],
            )
            for i, step in zip(idx, result.steps, strict=True):
                out[i] = step
            if result.warning:
                who = "" if rank is None else f" rank {rank}:"
                self.warnings.append(f"{self.log.source}:{who} {result.warning}")
        # strict=False: a step shifted past Int64 by absurd epoch numbers becomes null
        return frame.with_columns(pl.Series("step", out, dtype=pl.Int64, strict=False))

    def format_name(self) -> str:
        if self.formats:
            return self.formats.most_common(1)[0][0]
        return "events_only" if self.n_events else "none"


def _read_trainer_state(log: LogFile, index: int, warnings: list[str]) -> pl.DataFrame | None:
    """Hugging Face's trainer_state.json: ``log_history`` holds every logged step."""
    if log.path.stat().st_size > TRAINER_STATE_MAX_BYTES:
        warnings.append(f"{log.source}: too large for a trainer_state.json; skipped")
        return None
    try:
        with open(log.path, encoding="utf-8", errors="replace") as f:
            history = json.load(f).get("log_history", [])
    except (ValueError, AttributeError) as exc:
        warnings.append(f"{log.source}: not a readable trainer_state.json ({type(exc).__name__})")
        return None
    rows: list[dict[str, object]] = []
    for entry in history if isinstance(history, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("loss"), (int, float)):
            continue
        rows.append(
            {
                "rank": log.rank,
                "step": _int_or_none(entry.get("step")),
                "loss": float(entry["loss"]),
                "epoch": _float_or_none(entry.get("epoch")),
                "lr": _float_or_none(entry.get("learning_rate")),
                "grad_norm": _float_or_none(entry.get("grad_norm")),
                "source": log.source,
                "line": None,
                "acc": None,
                "step_total": None,
                "_t": None,
                "_file": index,
            }
        )
    if not rows:
        return None
    frame = pl.DataFrame(rows, schema=_WORK_SCHEMA, strict=False)
    if frame["step"].null_count():
        # steps missing: order of appearance, as for printed HF dicts
        frame = frame.with_columns(pl.Series("step", range(1, frame.height + 1), dtype=pl.Int64))
    return frame


def _int_or_none(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _align_steps(events: list[tuple[int, Event]], losses: pl.DataFrame) -> None:
    """Set each event's step to the last loss step its rank printed before it:
    in the same file by line order, else across files by time when both carry one."""
    if losses.is_empty() or not events:
        return
    by_file: dict[tuple[int, int | None], tuple[np.ndarray, np.ndarray]] = {}
    only_rank: dict[int, int | None] = {}
    for (file_index, rank), group in losses.filter(pl.col("step").is_not_null()).group_by(
        ["_file", "rank"], maintain_order=True
    ):
        order = group.sort("line")
        by_file[(file_index, rank)] = (order["line"].to_numpy(), order["step"].to_numpy())
        only_rank[file_index] = rank if file_index not in only_rank else -1  # -1: several ranks
    by_time: dict[int | None, tuple[np.ndarray, np.ndarray]] = {}
    timed = losses.filter(pl.col("_t").is_not_null() & pl.col("step").is_not_null())
    for (rank,), group in timed.group_by(["rank"]):
        order = group.sort("_t")
        by_time[rank] = (order["_t"].to_numpy(), order["step"].to_numpy())
    for file_index, event in events:
        if event.rank is None and only_rank.get(file_index, -1) not in (-1, None):
            # a file whose losses all belong to one rank is that rank's log
            event.rank = only_rank[file_index]
        same_file = by_file.get((file_index, event.rank))
        if same_file is not None and event.line is not None:
            i = int(np.searchsorted(same_file[0], event.line, side="right")) - 1
            if i >= 0:
                event.step = int(same_file[1][i])
                continue
        series = by_time.get(event.rank)
        if series is not None and event.t is not None:
            i = int(np.searchsorted(series[0], event.t, side="right")) - 1
            if i >= 0:
                event.step = int(series[1][i])


def _rank_warnings(losses: pl.DataFrame) -> list[str]:
    out: list[str] = []
    ranks = sorted(r for r in losses["rank"].unique().to_list() if r is not None)
    if ranks and ranks[-1] < 100_000:
        missing = sorted(set(range(ranks[-1] + 1)) - set(ranks))
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
            out.append(f"no loss lines for rank(s) {shown} (ranks seen: {ranks[0]}..{ranks[-1]})")
    spans = (
        losses.filter(pl.col("rank").is_not_null())
        .group_by(["rank", "source"], maintain_order=True)
        .agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
    )
    for (rank,), group in spans.group_by(["rank"], maintain_order=True):
        if group.height < 2:
            continue
        rows = group.sort("lo").rows(named=True)
        if any(b["lo"] <= a["hi"] for a, b in pairwise(rows)):
            names = ", ".join(r["source"] for r in rows[:4])
            out.append(
                f"rank {rank} prints overlapping steps in {group.height} files ({names}); one may copy another (torchrun --tee)"
            )
    return out


def ingest_logs(paths: Sequence[str | os.PathLike[str]]) -> LogData:
    """Read logs (files or folders, walked recursively) into loss series and events.

    Never raises on bad content: unreadable parts become ``warnings``. Raises
    ``syncdoctor.errors.InputError`` only when nothing at all could be read.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise InputError("no log files given")
    logs, warnings = discover(paths)
    if not logs:
        raise InputError("no log files found in " + ", ".join(str(p) for p in paths))
    store = _EventStore()
    frames: list[pl.DataFrame] = []
    value_frames: list[pl.DataFrame] = []
    unranked: list[str] = []
    n_lines = 0
    formats: dict[str, str] = {}
    read: list[str] = []
    for index, log in enumerate(logs):
        if log.is_trainer_state:
            try:
                frame = _read_trainer_state(log, index, warnings)
            except OSError as exc:
                warnings.append(f"{log.source}: {exc.strerror or exc}")
                continue
            read.append(log.source)
            formats[log.source] = "hf_trainer_state" if frame is not None else "none"
            if frame is not None:
                frames.append(frame)
            continue
        reader = _FileReader(log, index, store, warnings)
        try:
            if not reader.read():
                continue
        except OSError as exc:
            # includes gzip.BadGzipFile; keep what was read before the error
            warnings.append(f"{log.source}: read error after line {reader.lines_read}: {exc.strerror or exc}")
        except (EOFError, zlib.error) as exc:
            warnings.append(f"{log.source}: truncated or corrupt compressed log ({exc})")
        read.append(log.source)
        n_lines += reader.lines_read
        frame = reader.loss_frame()
        if frame is not None:
            frames.append(frame)
            if frame["rank"].null_count() == frame.height:
                unranked.append(log.source)
        values = reader.value_frame(frame)
        if values is not None:
            value_frames.append(values)
        formats[log.source] = reader.format_name()
        if formats[log.source] == "none" and not any(w.startswith(log.source) for w in warnings):
            warnings.append(f"{log.source}: no loss lines or events recognised")
    if not read:
        raise InputError("none of the logs could be read: " + "; ".join(warnings[:3]))
    work = pl.concat(frames) if frames else pl.DataFrame(schema=_WORK_SCHEMA)
    kept = store.events()
    _align_steps(kept, work)
    warnings.extend(store.dropped())
    if not work.is_empty():
        warnings.extend(_rank_warnings(work))
    if unranked:
        shown = ", ".join(unranked[:4]) + (" ..." if len(unranked) > 4 else "")
        warnings.append(
            f"no rank could be told for the loss lines of {shown} (no launcher prefix, rank field or rank "
            "in the file name): read as one unknown rank"
        )
    return LogData(
        losses=work.select(list(LOSS_SCHEMA)),
        events=[e for _, e in kept],
        files=read,
        warnings=warnings,
        formats=formats,
        values=pl.concat(value_frames) if value_frames else pl.DataFrame(schema=VALUES_SCHEMA),
        unranked=unranked,
        n_lines=n_lines,
    )


__all__ = ["LOSS_SCHEMA", "LogData", "ingest_logs"]

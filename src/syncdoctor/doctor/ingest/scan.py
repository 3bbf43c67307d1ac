"""Streaming a log in big chunks and picking out the few lines worth parsing.

Training logs are mostly noise (data-loader chatter, progress bars, warnings);
the lines that matter hold a loss or a communication/process event. Parsing every
line with Python regexes runs at tens of MB/s, far too slow for multi-GB logs.
So each chunk (16 MiB of whole lines) is split into lines by polars' CSV reader
(multi-threaded, invalid UTF-8 replaced) and filtered with one alternation of
keyword literals, which Rust's regex engine matches with SIMD; only the
surviving few percent of lines reach Python.

Memory stays bounded: one chunk at a time, and a line longer than
MAX_LINE_BYTES is cut to that prefix and the rest of it skipped unread.
"""

from __future__ import annotations

import io
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

import polars as pl

CHUNK_BYTES = 16 << 20
# Blocks scanned at once, ahead of the chunk being parsed. Much of a block's scan
# (the keyword search) runs on one thread in polars; with one block ahead, a core sat
# idle whenever the parser waited for it. Two scans at once keep both cores of a small
# machine busy; each costs one more block in memory.
SCAN_WORKERS = 2
MAX_LINE_BYTES = 1 << 20
# Python regexes look at no more than this much of one line (or of one "\r"
# segment of a progress-bar line): bounded work per line whatever the input.
PARSE_CHARS = 8192

# Literal fragments, in the case variants that occur, because a case-insensitive
# regex defeats the SIMD literal search (measured ~10x slower). Fragments such as
# "rror" catch Error/error/RuntimeError/ncclSystemError at once. The list is kept
# short on purpose: past ~48 literals the SIMD matcher gives way to a slower one
# (measured ~1.7x), so all-capitals variants are listed only where logs use them
# ("[ERROR]", "TIMEOUT"): other capitals-only lines hold one of these anyway.
LOSS_LITERALS = ("loss", "Loss", "step", "Step")
EVENT_LITERALS = (
    # errors and exceptions: RuntimeError, [ERROR], NCCL error, DistBackendError
    "rror", "RROR", "xception", "Interrupt",
    # timeouts in their many spellings
    "imeout", "IMEOUT", "imed out", "ime out", "imes out",
    # communication libraries and their watchdogs, retries, mismatches
    "NCCL", "nccl", "HCCL", "hccl", "hcom", "Hcom", "atchdog", "eartbeat",
    "etry", "ismatch", "onnect", "roken pipe",
    # processes dying or being stopped
    "illed", "ignal", "SIG", "egmentation", "core dumped", "bort", "erminat",
    "fail", "Fail", "exit", "Exit", "busy", "emory", "OOM",
    # the playbook's "[WARNING] Loss shows abnormal fluctuation ..."
    "luctuation",
    # CANN error codes that start a line with no other keyword (EI0004, EI0005, EJ0001)
    "EI0", "EJ0",
    # NCCL's "Duplicate GPU detected", Horovod's "Stalled ops" / "[missing ranks: 1]",
    # DDP's "did not receive grad", loss-scale overflow (DeepSpeed, apex, MindSpore)
    "uplicate", "talled", "issing rank", "not receive", "verflow", "VERFLOW",
    # Horovod's stall report: "... submitted ... by subset of ranks and are waiting ..."
    "ubset of rank",
    # logger levels worse than ERROR, and a traceback's head (it may be cut before its exception)
    "FATAL", "raceback",
    # MindSpore: "This node could be redundant and is not successfully registered"
    "edundant",
)  # fmt: skip


def _alternation(literals: tuple[str, ...]) -> str:
    return "|".join(re.escape(s) for s in literals)


CANDIDATE_PATTERN = _alternation(LOSS_LITERALS + EVENT_LITERALS)
EVENT_PATTERN = _alternation(EVENT_LITERALS)
# The first block of a file is also read for lines a logger marked as warnings
# (WARNING, CRITICAL ...), though they hold no keyword above: they say what a short
# log holds. Only the first LEVEL_HEAD and last LEVEL_TAIL of them reach Python, and
# later blocks are not searched for them (the literal scan above stays one pass).
LEVEL_PATTERN = r"WARN|Warn|FATAL|Fatal|CRITICAL|Critical|Traceback"
LEVEL_HEAD = 200
LEVEL_TAIL = 50
ANY_PATTERN = CANDIDATE_PATTERN + "|" + LEVEL_PATTERN
# The first lines of a file are read whatever they hold: what each rank prints once
# at start (versions, world size, configuration) is compared across ranks.
HEAD_ROWS = 200
# ... and so are its last lines (ingest/core.py reads them once the file has ended):
# what each rank prints once at the end (a final evaluation) is compared too.
TAIL_ROWS = 200

_CSV_OPTIONS = {
    "has_header": False,
    "separator": "\x1f",  # a byte that logs practically never hold: one column per line
    "quote_char": None,
    "comment_prefix": None,
    "encoding": "utf8-lossy",
    "truncate_ragged_lines": True,
    "extra_columns": "ignore",
    "schema": {"l": pl.String},
    "raise_if_empty": False,
}


@dataclass
class Chunk:
    """Whole lines of one file: the candidates, and the chunk for context look-ups."""

    first_line: int  # 1-based number of the chunk's first line
    frame: pl.DataFrame  # every line of the chunk, column "l" (null for empty lines)
    lines: list[int]  # candidate line numbers, ascending
    texts: list[str]
    eventish: list[bool]  # the candidate holds an event keyword (not only loss/step)
    long_lines: list[int] = field(default_factory=list)  # lines cut to MAX_LINE_BYTES
    # The candidates as a frame: "i" (row in the chunk), "l", "ev", and "s", the line's
    # shape (every digit run collapsed to one "0", as the loss parser computes it) where
    # the line may take the shape fast path (ingest/core.py): ASCII, no "\r", at most
    # PARSE_CHARS long; null elsewhere.
    candidates: pl.DataFrame | None = None
    # per candidate: the literals asked for (iter_chunks' ``anchors``) that the line
    # holds once lower-cased, every occurrence; None where not searched (a line with
    # no event keyword, or not ASCII: Python's lower() maps some non-ASCII letters to
    # ASCII ones)
    anchors: list[list[str] | None] = field(default_factory=list)
    prepared: object = None  # what iter_chunks' ``prepare`` made of the candidates

    @property
    def n_lines(self) -> int:
        return self.frame.height

    def context(self, line_no: int, before: int, after: int) -> list[tuple[int, str]]:
        """Lines around ``line_no`` within this chunk (multi-line blocks such as
        torchrun's failure summary, whose field lines hold no keyword)."""
        start = max(line_no - before, self.first_line)
        stop = min(line_no + after, self.first_line + self.n_lines - 1)
        rows = self.frame["l"].slice(start - self.first_line, stop - start + 1).to_list()
        return [(start + i, text or "") for i, text in enumerate(rows)]


class TolerantStream:
    """Reads a compressed stream until it breaks, keeping what came before.

    gzip raises EOFError for a truncated file and drops everything the failing
    read() call had decompressed; read1() in small steps loses at most one step."""

    STEP = 64 << 10

    def __init__(self, stream: BinaryIO) -> None:
        self._read = getattr(stream, "read1", stream.read)
        self.error: Exception | None = None

    def read(self, size: int) -> bytes:
        parts: list[bytes] = []
        got = 0
        while got < size and self.error is None:
            try:
                part = self._read(min(self.STEP, size - got))
            except (EOFError, OSError, zlib.error) as exc:
                self.error = exc
                break
            if not part:
                break
            parts.append(part)
            got += len(part)
        return b"".join(parts)


# How much of a window's end is read to find its last newline (see _exact_block).
PROBE_BYTES = 1 << 16


def _exact_block(stream: BinaryIO, chunk_bytes: int, carry: bytes) -> tuple[bytes, bytes] | None:
    """The block the generic step of ``_blocks`` would cut from the next window, and
    the carry it would leave, read from a seekable file without copying the block:
    the window's last newline is found in its last PROBE_BYTES, then the block is read
    with one read of exactly its bytes (slicing and joining 16 MiB cost a fifth of
    the main thread). None, the stream back at the window, where that does not hold
    (no newline in the probe, the end of the file, a file that changed)."""
    window = stream.tell()
    end_of_file = stream.seek(0, io.SEEK_END)
    window_end = min(window + chunk_bytes, end_of_file)
    probe_at = max(window, window_end - PROBE_BYTES)
    stream.seek(probe_at)
    tail = stream.read(window_end - probe_at) if window_end > window else b""
    cut = tail.rfind(b"\n")
    if cut < 0 or len(tail) != window_end - probe_at:
        stream.seek(window)
        return None
    start = window - len(carry)
    stop = probe_at + cut + 1
    stream.seek(start)
    block = stream.read(stop - start)
    if len(block) != stop - start or not block.startswith(carry):
        stream.seek(window)
        return None
    stream.seek(window_end)
    return block, tail[cut + 1 :]


def _blocks(stream: BinaryIO | TolerantStream, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Yield (whole lines, last line was truncated) from a byte stream."""
    carry = b""
    skipping = False  # inside an over-long line whose prefix was already yielded
    # Plain files (and in-memory buffers) can be read block by block exactly; a
    # decompressing stream, whose seek would decompress again, cannot.
    seekable = isinstance(stream, (io.BufferedReader, io.BytesIO)) and stream.seekable()
    while True:
        if seekable and not skipping:
            exact = _exact_block(stream, chunk_bytes, carry)  # type: ignore[arg-type]
            if exact is not None:
                block, carry = exact
                yield block, False
                continue
        data = stream.read(chunk_bytes)
        if not data:
            if carry:
                yield carry + b"\n", False
            return
        if skipping:
            nl = data.find(b"\n")
            if nl < 0:
                continue
            data = data[nl + 1 :]
            skipping = False
        cut = data.rfind(b"\n")
        if cut < 0:
            carry += data
        else:
            block = carry + data[: cut + 1] if carry else data[: cut + 1]
            carry = data[cut + 1 :]
            yield block, False
        if len(carry) > MAX_LINE_BYTES:
            # A pathological line (a 100 MB JSON dump, binary junk with no newline):
            # keep a bounded prefix, drop the rest without holding it in memory.
            yield carry[:MAX_LINE_BYTES] + b"\n", True
            carry = b""
            skipping = True


def _split_lines(block: bytes) -> pl.DataFrame:
    """One row per line. The CSV reader splits exactly at "\n" (dropping a "\r"
    before it) with these options - the property tests pin that down, because
    line numbers are counted from rows; counting newlines here as well would
    cost a fifth of the scan."""
    try:
        return pl.read_csv(block, **_CSV_OPTIONS)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - any reader failure falls back to the slow path
        text = block.decode("utf-8", errors="replace")
        rows = text.split("\n")[:-1]  # blocks end with "\n"
        return pl.DataFrame({"l": [r.removesuffix("\r") or None for r in rows]}, schema={"l": pl.String})


_Scanned = tuple[pl.DataFrame, pl.DataFrame, list[int], object]


def _with_shapes(cand: pl.DataFrame, anchors: tuple[str, ...] = ()) -> pl.DataFrame:
    """The candidates' shapes, computed here off the main thread: Rust collapses the
    digit runs of a few percent of the lines faster than Python splits one. Only
    ASCII lines get one, where "[0-9]" and Python's "\\d" agree. With ``anchors``,
    also the anchors each ASCII event candidate holds ("a", see Chunk.anchors)."""
    line = pl.col("l")
    ascii_ = line.str.len_bytes() == line.str.len_chars()
    fast = ascii_ & (line.str.len_bytes() <= PARSE_CHARS) & ~line.str.contains("\r", literal=True)
    columns = [pl.when(fast).then(line.str.replace_all("[0-9]+", "0")).alias("s")]
    if anchors:
        # lower-cased first: extract_many gives the matched text, not the pattern
        found = line.str.to_lowercase().str.extract_many(list(anchors), overlapping=True)
        columns.append(pl.when(ascii_ & pl.col("ev")).then(found).alias("a"))
    return cand.with_columns(columns)


def _scan_block(
    block: bytes, head_rows: int = 0, anchors: tuple[str, ...] = ()
) -> tuple[pl.DataFrame, pl.DataFrame, list[int]]:
    """Split one block into lines and keep the candidates (runs off the main thread:
    polars releases the GIL, so Python parses the previous chunk meanwhile); the
    first ``head_rows`` lines are candidates whatever they hold."""
    frame = _split_lines(block)
    # A long line inside a block (a 10 MB dump) is cut like one spanning blocks,
    # so no regex, Rust or Python, ever walks more than MAX_LINE_BYTES of a line.
    lengths = frame["l"].str.len_bytes()
    long_rows: list[int] = []
    if frame.height and (lengths.max() or 0) > MAX_LINE_BYTES:  # type: ignore[operator]
        long_rows = (lengths > MAX_LINE_BYTES).arg_true().to_list()
        frame = frame.with_columns(pl.col("l").str.head(MAX_LINE_BYTES))
    if not head_rows:
        cand = (
            frame.lazy()
            .with_row_index("i")
            .filter(pl.col("l").str.contains(CANDIDATE_PATTERN))
            .with_columns(pl.col("l").str.contains(EVENT_PATTERN).alias("ev"))
            .collect()
        )
        return frame, _with_shapes(cand, anchors), long_rows
    passed = (
        frame.lazy()
        .with_row_index("i")
        .filter(pl.col("l").str.contains(ANY_PATTERN) | (pl.col("i") < head_rows))
        .collect()
    )
    keep = passed["l"].str.contains(CANDIDATE_PATTERN).fill_null(False) | (passed["i"] < head_rows)
    cand = passed.filter(keep)
    level_only = passed.filter(~keep)
    if level_only.height > LEVEL_HEAD + LEVEL_TAIL:
        level_only = pl.concat([level_only.head(LEVEL_HEAD), level_only.tail(LEVEL_TAIL)])
    if level_only.height:
        cand = pl.concat([cand, level_only]).sort("i")
    cand = cand.filter(pl.col("l").is_not_null()).with_columns(
        (
            pl.col("l").str.contains(EVENT_PATTERN)
            | pl.col("l").str.contains(LEVEL_PATTERN)
            | (pl.col("i") < head_rows)
        ).alias("ev")
    )
    return frame, _with_shapes(cand, anchors), long_rows


def _scan_and_prepare(
    block: bytes, head_rows: int, anchors: tuple[str, ...], prepare: Callable[[pl.DataFrame], object] | None
) -> _Scanned:
    frame, cand, long_rows = _scan_block(block, head_rows, anchors)
    return frame, cand, long_rows, None if prepare is None else prepare(cand)


def iter_chunks(
    stream: BinaryIO | TolerantStream,
    chunk_bytes: int = CHUNK_BYTES,
    anchors: tuple[str, ...] = (),
    prepare: Callable[[pl.DataFrame], object] | None = None,
) -> Iterator[Chunk]:
    """Chunks of whole lines with their candidate lines, in file order. SCAN_WORKERS
    blocks are always being scanned ahead of the chunk the caller is parsing. ``anchors``:
    lower-case ASCII literals to report per event candidate (Chunk.anchors);
    ``prepare``: run on the candidates on the scanning thread (Chunk.prepared)."""
    first_line = 1
    ahead: deque[tuple[Future[_Scanned], bool]] = deque()

    def finish(item: tuple[Future[_Scanned], bool]) -> Chunk:
        nonlocal first_line
        future, truncated = item
        frame, cand, long_rows, prepared = future.result()
        if truncated:  # the block's last line is the prefix of an over-long line
            long_rows = sorted({*long_rows, frame.height - 1})
        chunk = Chunk(
            first_line=first_line,
            frame=frame,
            lines=[first_line + i for i in cand["i"].to_list()],
            texts=cand["l"].to_list(),
            eventish=cand["ev"].to_list(),
            long_lines=[first_line + i for i in long_rows],
            candidates=cand,
            prepared=prepared,
            anchors=cand["a"].to_list() if "a" in cand.columns else [None] * cand.height,
        )
        first_line += frame.height
        return chunk

    with ThreadPoolExecutor(max_workers=SCAN_WORKERS) as pool:
        for n, (block, truncated) in enumerate(_blocks(stream, chunk_bytes)):
            ahead.append(
                (pool.submit(_scan_and_prepare, block, HEAD_ROWS if n == 0 else 0, anchors, prepare), truncated)
            )
            if len(ahead) > SCAN_WORKERS:
                yield finish(ahead.popleft())
        while ahead:
            yield finish(ahead.popleft())

"""Tolerant reader of probe run folders into polars frames.

Step records (the bulk: ranks × steps) go straight to polars with a fixed schema;
the few other records are parsed with json. A truncated last line, a corrupt line or
a rank file that is missing becomes a warning, never an exception.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from syncdoctor.records import cache, contract, window
from syncdoctor.records.schema import RECORDS_SUBDIR, SCHEMA_VERSION, STEP_SCHEMA, RecordError
from syncdoctor.records.tail import KEY_END, read_tail

_RANK_FILE = cache.RANK_FILE
_STEP_PREFIX = b'{"v":1,"kind":"step"'
# The largest world size believed: a corrupt or hostile record claiming 2**62 ranks
# must not make the reader (or a report) walk every rank number up to it.
MAX_WORLD_SIZE = 1 << 20

# The types of the non-step records' fields, from the contract (records/contract.py):
# a list's elements too; null is always allowed. A record that breaks them is
# skipped and counted like a corrupt line, so the analyses can trust what they get
# (docs/records.md).
_FIELD_TYPES: dict[str, dict[str, str]] = {
    kind: {f.name: f.type for f in fields if f.name not in ("v", "kind", "rank")}
    for kind, fields in contract.KINDS.items()
    if kind != contract.KIND_STEP
}
_REQUIRED = {"check": ("step",)}  # the doctor orders checks by step


@dataclass
class RunRecords:
    run_dir: Path
    snapshots: dict[int, dict[str, Any]] = field(default_factory=dict)
    steps: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=STEP_SCHEMA))
    checks: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ends: dict[int, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    @property
    def world_size(self) -> int | None:
        sizes = {s.get("world_size") for s in self.snapshots.values()}
        valid = {n for n in sizes if isinstance(n, int) and 0 < n <= MAX_WORLD_SIZE}
        return max(valid) if valid else (max(self.ranks) + 1 if self.ranks else None)


def is_run_dir(path: Path) -> bool:
    return (path / RECORDS_SUBDIR).is_dir() and any((path / RECORDS_SUBDIR).glob("rank*.jsonl"))


def read_run(run_dir: str | Path, *, use_cache: bool | None = None) -> RunRecords:
    """A run folder's records. The first read of a finished run keeps them in a
    columnar cache beside it (records/cache.py), which the next read takes instead of
    the JSON lines while they are unchanged. ``use_cache``: None follows the
    SYNCDOCTOR_RECORDS_CACHE variable (on unless "0"). The cache is built one rank
    file at a time (_convert), so building it needs memory for one rank, not the run."""
    run_dir = Path(run_dir)
    rec_dir = run_dir / RECORDS_SUBDIR
    if not rec_dir.is_dir():
        raise RecordError(f"{run_dir}: no {RECORDS_SUBDIR}/ folder with rank*.jsonl files")
    files = sorted(
        ((int(m.group(1)), p) for p in rec_dir.iterdir() if (m := _RANK_FILE.search(p.name))),
    )
    if not files:
        raise RecordError(f"{rec_dir}: no rank*.jsonl record files")
    # The key is taken before the files are read: a file that grows meanwhile makes
    # the cache look stale next time, never a stale cache look fresh.
    key = cache.source_key(rec_dir) if (cache.enabled() if use_cache is None else use_cache) else None
    if key is not None:
        if (kept := cache.load(run_dir, key)) is not None:
            return RunRecords(run_dir=run_dir, **kept)
        if (converted := _convert(run_dir, rec_dir, files, key)) is not None:
            return converted
    return _read_in_memory(run_dir, rec_dir, files, key)


def _read_in_memory(
    run_dir: Path, rec_dir: Path, files: list[tuple[int, Path]], key: dict[str, Any] | None
) -> RunRecords:
    """Every rank's step records parsed together, in memory (and kept in the cache when
    ``key`` is given and the files did not change meanwhile)."""
    out = RunRecords(run_dir=run_dir)
    files = _plausible_files(files, out)
    step_chunks: list[bytes] = []
    all_read = True
    for rank, path in files:
        out.ranks.append(rank)
        try:
            data = path.read_bytes()
        except OSError as exc:
            out.warnings.append(f"{path}: unreadable ({exc.strerror})")
            all_read = False  # may be readable next time, with the same size and mtime
            continue
        step_chunks.append(_read_rank_file(rank, path, data, out))
    out.steps = _parse_steps(b"".join(step_chunks), out)
    _warn_missing(out)
    if key is not None and all_read and cache.source_key(rec_dir) == key:
        cache.save(run_dir, key, out)
    return out


def _warn_missing(out: RunRecords) -> None:
    world = out.world_size
    if world:
        missing = sorted(set(range(world)) - set(out.ranks))
        if missing:
            shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
            out.warnings.append(f"no record file for ranks [{shown}] of world size {world}")


_NO_STEPS = pl.DataFrame()


@dataclass
class _Part:
    """What converting one rank file left: its other records (the fields of a
    RunRecords), its part file (None: no step records), rows kept and dropped, the
    columns its step records had."""

    records: RunRecords
    file: str | None = None
    rows: int = 0
    dropped: int = 0
    columns: tuple[str, ...] = ()
    valued: set[str] = field(default_factory=set)  # the columns with a value in some row
    parsed: bool = False
    tallied: pl.DataFrame | None = None  # the step records' columns the triage reads


def _convert_rank(rank: int, path: Path, part_path: Path, tally: window.Tally) -> _Part | None:
    """One rank file parsed alone, its step records written to ``part_path`` (and the
    columns the ``tally`` reads kept, for the triage); None where that could read
    differently from the whole run parsed together."""
    got = _Part(RunRecords(run_dir=path, steps=_NO_STEPS))  # (an empty frame of every column costs 0.5 ms)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    blob = _read_rank_file(rank, path, data, got.records, tails=False)  # a run with tails is not cached
    del data
    if not blob:
        return got
    part = _parse_part(rank, blob)
    del blob
    if part is None:
        return None
    frame, got.dropped = part
    got.columns, got.parsed, got.valued = tuple(frame.columns), True, cache.valued_columns(frame)
    if frame.height:
        try:
            cache.write_part(frame, part_path, got.valued)
        except Exception:
            return None
        got.file, got.rows = part_path.name, frame.height
        got.tallied = frame.select(tally.reads(got.valued))  # (the frame's columns, not copies)
    return got


# Rank files converted at once (threads: parsing and writing run in polars, without the
# GIL): each holds one rank's bytes and frame. One more than the cores, so that a core is
# not idle while a thread splits its file's lines under the GIL (256 ranks × 10,000
# steps converted in 5.8-6.0 s with three threads on two cores, 6.2-6.3 s with two).
CONVERT_THREADS = max(1, min(4, (os.cpu_count() or 1) + 1))
# Step records of converted ranks held for the triage (records/window.py Tally) before
# they are folded into its per-step aggregates.
TALLY_ROWS = 500_000


def _convert(run_dir: Path, rec_dir: Path, files: list[tuple[int, Path]], key: dict[str, Any]) -> RunRecords | None:
    """The cache built one rank file at a time, so that converting a big run never holds
    more than one rank's JSON lines and step frame per thread: each rank's step records
    parsed alone and written as a Parquet part, the parts kept as they are (the cache
    is the folder of parts, records/cache.py), then read back as a warm read would.
    None (and the whole run read in memory, as before) wherever that could read
    differently: a rank file with step records of another rank, a step twice, a
    corrupt step line, an unreadable file; or where the cache cannot be kept (files
    just written, a folder that cannot be written to)."""
    if cache.racy(key):
        return None
    out = RunRecords(run_dir=run_dir)
    files = _plausible_files(files, out)
    with cache.parts_folder(run_dir) as parts_dir:
        if parts_dir is None:
            return None
        names: list[tuple[str, int]] = []
        present: set[str] = set()
        valued: set[str] = set()
        unusable = 0
        parsed = False
        # The triage of a big run's bounded read (records/window.py), from the records as
        # they are converted: the cache keeps it, so that no read decodes the parts for it.
        # It may read any scalar column; each part hands it those with a value.
        tally = window.Tally(pl.Schema(_kept_schema(set())))
        held: list[pl.DataFrame] = []
        # In rank order, as a read of the whole run: the other records, the warnings.
        with ThreadPoolExecutor(CONVERT_THREADS) as pool:
            done = pool.map(
                _convert_rank,
                [rank for rank, _ in files],
                [path for _, path in files],
                [parts_dir / f"{i}.parquet" for i in range(len(files))],
                [tally] * len(files),
            )
            for (rank, _), got in zip(files, done, strict=True):
                out.ranks.append(rank)
                if got is None:
                    pool.shutdown(cancel_futures=True)
                    return None
                mine = got.records
                out.snapshots.update(mine.snapshots)
                out.checks += mine.checks
                out.events += mine.events
                out.ends.update(mine.ends)
                out.warnings += mine.warnings
                unusable += got.dropped
                present.update(got.columns)
                valued.update(got.valued)
                parsed = parsed or got.parsed
                if got.file is not None:
                    names.append((got.file, got.rows))
                if got.tallied is not None:
                    held.append(got.tallied)
                    if sum(frame.height for frame in held) >= TALLY_ROWS:
                        tally.add(pl.concat(held, how="diagonal").lazy())
                        held.clear()
        if held:
            tally.add(pl.concat(held, how="diagonal").lazy())
            held.clear()
        if unusable:
            out.warnings.append(f"{unusable} step records without a usable rank or step skipped")
        _warn_missing(out)
        schema = {name: dtype for name, dtype in STEP_SCHEMA.items() if name in present}
        if not names:
            # as the in-memory read leaves a run without usable step records: every
            # column where there were none at all
            out.steps = pl.DataFrame(schema=schema if parsed else STEP_SCHEMA)
            if cache.source_key(rec_dir) != key:
                return out
            cache.save(run_dir, key, out)
            return out
        found = tally.triage().to_json()
        if not cache.publish(run_dir, key, parts_dir, names, pl.Schema(schema), out, valued, found):
            return None
    kept = cache.load(run_dir, key)
    if kept is None:
        return None
    if cache.source_key(rec_dir) != key:  # a file changed while it was read: not kept
        cache.drop(run_dir)
    return RunRecords(run_dir=run_dir, **kept)


def _parse_part(rank: int, blob: bytes) -> tuple[pl.DataFrame, int] | None:
    """One rank's step records as _parse_steps makes them (its usable rows, and how many
    it dropped), or None where a part parsed alone could differ from the whole run
    parsed together: a corrupt line (the whole run is then read line by line), a record
    of another rank, a step twice (their order after sorting the whole run)."""
    try:
        frame = _read_steps(blob)
    except Exception:
        return None
    keep = frame.select((pl.col("step").is_not_null() & pl.col("rank").is_between(0, MAX_WORLD_SIZE - 1)).alias("k"))
    usable = frame if keep["k"].all() else frame.filter(keep["k"])
    if not usable.height:
        return usable, frame.height
    if not (usable["rank"] == rank).all():
        return None
    # sorted by step already, as a rank writes them (the whole run's sort, one rank's share)
    if not _increasing(usable["step"]):
        usable = usable.sort("step")
        if not _increasing(usable["step"]):  # a step twice
            return None
    return _restore_nonfinite(usable), frame.height - usable.height


def _increasing(steps: pl.Series) -> bool:
    return steps.len() < 2 or bool((steps.diff().drop_nulls() > 0).all())


def _plausible_files(files: list[tuple[int, Path]], out: RunRecords) -> list[tuple[int, Path]]:
    """Drop rank numbers beyond MAX_WORLD_SIZE and a second file for one rank
    (rank7.jsonl and rank007.jsonl): one file per rank, named by its rank."""
    kept: dict[int, Path] = {}
    for rank, path in files:
        if rank >= MAX_WORLD_SIZE:
            out.warnings.append(f"{path.name}: rank {rank} is beyond any real world size; skipped")
        elif rank in kept:
            out.warnings.append(f"{path.name}: a second record file for rank {rank}; skipped")
        else:
            kept[rank] = path
    return sorted(kept.items())


def _read_rank_file(rank: int, path: Path, data: bytes, out: RunRecords, *, tails: bool = True) -> bytes:
    """Split one rank's file: step lines are returned as bytes, the rest parsed here.
    ``tails``: look for the rank's tail files too (a listing of the folder, for each rank)."""
    if data and not data.endswith(b"\n"):
        cut = data.rfind(b"\n") + 1
        out.warnings.append(
            f"{path.name}: last record truncated ({len(data) - cut} bytes dropped; "
            "the rank was probably killed while writing)"
        )
        data = data[:cut]
    # Step lines are nearly all of a file and go to polars untouched; only the few
    # others are parsed here, one by one.
    lines = data.split(b"\n")
    is_step = [line.startswith(_STEP_PREFIX) for line in lines]
    steps = list(compress(lines, is_step))
    others = [(n + 1, lines[n]) for n in _falses(is_step) if lines[n].strip()]
    bad = 0
    for lineno, line in others:
        try:
            rec = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
            continue
        if rec.get("v") is None:  # JSON, but not a record: damage, like a torn line
            bad += 1
            continue
        if rec.get("v") != SCHEMA_VERSION:
            raise RecordError(
                f"{path}:{lineno}: record schema version {rec.get('v')!r} is not supported "
                f"(this syncdoctor reads version {SCHEMA_VERSION})"
            )
        kind = rec.get("kind")
        if not _well_typed(rec, kind):
            bad += 1
            continue
        if type(rec.get("rank")) is not int:  # missing or mangled: the file names the rank
            rec["rank"] = rank
        if kind == "snapshot":
            out.snapshots[rank] = rec
        elif kind == "check":
            out.checks.append(rec)
        elif kind == "event":
            out.events.append(rec)
        elif kind == "end":
            out.ends[rank] = rec
        elif kind == "step":  # written by another encoder: different key order
            steps.append(json.dumps(rec, separators=(",", ":")).encode())
        else:
            bad += 1
    if bad:
        out.warnings.append(f"{path.name}: {bad} unreadable lines skipped")
    if tails:
        steps += _tail_steps(rank, path, steps, out)
    return b"\n".join(steps) + b"\n" if steps else b""


def _falses(flags: list[bool]) -> Iterator[int]:
    """The positions of the (few) False values, found at C speed."""
    at = -1
    while True:
        try:
            at = flags.index(False, at + 1)
        except ValueError:
            return
        yield at


def _tail_steps(rank: int, path: Path, steps: list[bytes], out: RunRecords) -> list[bytes]:
    """Step records still in the rank's tail files (records/tail.py): left by a rank
    that is running or was killed. A step a kill caught between writing it to the
    JSON-lines file and marking it written is there twice: it is taken once."""
    tails = sorted(path.parent.glob(f"rank{rank}.*.tail"))
    if not tails:
        return []
    written = {line[: line.find(KEY_END)] for line in steps}
    recovered: list[bytes] = []
    for tail in tails:
        try:
            tail_rank, lines = read_tail(tail)
        except (OSError, ValueError) as exc:
            out.warnings.append(f"{tail.name}: not read ({exc})")
            continue
        if tail_rank != rank:
            out.warnings.append(f"{tail.name}: holds rank {tail_rank}, not {rank}; skipped")
            continue
        new = [line.rstrip(b"\n") for line in lines if line[: line.find(KEY_END)] not in written]
        if new:
            out.warnings.append(
                f"{path.name}: {len(new)} step records read from {tail.name}, not yet in the "
                "file (the rank is still running, or was killed)"
            )
            recovered += new
    return recovered


def _well_typed(rec: dict[str, Any], kind: Any) -> bool:
    if not isinstance(kind, str):  # {"kind": [...]} is damage, not a new kind (found by fuzzing)
        return False
    types = _FIELD_TYPES.get(kind, {})
    for key, expected in types.items():
        value = rec.get(key)
        if value is None:
            if key in _REQUIRED.get(kind, ()):
                return False
        elif not contract.holds(value, expected):  # (bool is an int in Python, never in the format)
            return False
    return True


# Nested columns (lists, structs) are read only when some step record has the key:
# most runs write none of them, and carrying them as all-null columns for every row cost
# 10 % of the doctor's peak memory at 256 ranks × 10,000 steps. The rules that read them
# look for the column first. The scalar columns are all in the frame, null where no
# record has them.
_NESTED = [name for name, dtype in STEP_SCHEMA.items() if isinstance(dtype, (pl.List, pl.Struct))]
_NESTED_SET = frozenset(_NESTED)
# Lines of a blob whose keys are taken by parsing them, before the search for the rest.
_SAMPLE_LINES = 64


def _read_steps(blob: bytes) -> pl.DataFrame:
    """The step records in ``blob`` as a frame of the columns the reader keeps (every
    scalar column of STEP_SCHEMA, the nested ones some record has), in STEP_SCHEMA's
    order. Parsed with only the keys some record has: given the schema's columns that no
    record has as well, polars' JSON reader took a third more time (3.98 s against 2.85 s
    for the 2.56 M records of 256 ranks × 10,000 steps), so the keys are found
    first: those of the first lines by parsing them, then one search of the whole blob
    for all the others at once (Aho-Corasick, 0.7 s for those records), and one by one
    only where that search found some. Raises where a line is not JSON."""
    present = _present_keys(blob)
    keep = _kept_schema(present)
    frame = pl.read_ndjson(
        io.BytesIO(blob), schema={name: dtype for name, dtype in keep.items() if name in present}, ignore_errors=True
    )
    absent = [pl.lit(None, dtype).alias(name) for name, dtype in keep.items() if name not in present]
    return frame.with_columns(absent).select(list(keep)) if absent else frame


def _kept_schema(present: set[str]) -> dict[str, pl.DataType]:
    """The step frame's columns: every scalar one, the nested ones in ``present``."""
    return {name: dtype for name, dtype in STEP_SCHEMA.items() if name in present or name not in _NESTED_SET}


def _present_keys(blob: bytes) -> set[str]:
    """The keys of STEP_SCHEMA that appear as a key (``"name":``) somewhere in ``blob``
    (a string value that holds such text counts too: a column of nulls more, never one
    less)."""
    seen: set[str] = set()
    for line in blob.split(b"\n", _SAMPLE_LINES)[:_SAMPLE_LINES]:
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            seen.update(rec)
    present = {name for name in STEP_SCHEMA if name in seen}
    rest = [name for name in STEP_SCHEMA if name not in present]
    if not rest:
        return present
    whole = pl.Series([blob], dtype=pl.Binary)
    try:
        some = whole.cast(pl.String).str.contains_any([f'"{name}":' for name in rest]).item()
    except Exception:  # not UTF-8
        some = True
    if some:
        present.update(name for name in rest if whole.bin.contains(f'"{name}":'.encode()).item())
    return present


def _parse_steps(blob: bytes, out: RunRecords) -> pl.DataFrame:
    if not blob:
        return pl.DataFrame(schema=STEP_SCHEMA)
    try:
        frame = _read_steps(blob)
    except Exception:  # a corrupt line inside: fall back to line by line
        schema = _kept_schema(_present_keys(blob))
        rows = []
        for line in blob.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict):
                rows.append({k: _coerce(rec.get(k), dtype) for k, dtype in schema.items()})
        out.warnings.append("some step records were corrupt and skipped")
        frame = pl.DataFrame(rows, schema=schema, strict=False)
    # Every analysis groups by rank and step: a row without them (or with a rank no
    # real job has) is dropped here rather than breaking them downstream.
    usable = frame.filter(pl.col("step").is_not_null() & pl.col("rank").is_between(0, MAX_WORLD_SIZE - 1))
    usable = _restore_nonfinite(usable)
    if usable.height < frame.height:
        out.warnings.append(f"{frame.height - usable.height} step records without a usable rank or step skipped")
    return usable.sort(["rank", "step"])


_NONFINITE = [f.name for f in contract.field(contract.KIND_STEP, "nonfinite").fields]


def _restore_nonfinite(frame: pl.DataFrame) -> pl.DataFrame:
    """A NaN or infinite float (loss, lr, grad_norm, ...) comes back as the float it
    was ("nan", "inf" in the record's `nonfinite` field): a loss that went NaN is
    evidence, not a gap."""
    if "nonfinite" not in frame.columns or frame["nonfinite"].null_count() == frame.height:
        return frame
    return frame.with_columns(
        pl.coalesce(pl.col("nonfinite").struct.field(name).cast(pl.Float64, strict=False), pl.col(name)).alias(name)
        for name in _NONFINITE
    )


def _coerce(value: Any, dtype: pl.DataType | pl.datatypes.DataTypeClass) -> Any:
    """A JSON value as ``dtype`` holds it, else None: what polars' ignore_errors
    does on the fast path, for the lines it could not take at all."""
    if isinstance(dtype, pl.List):
        return [_coerce(v, dtype.inner) for v in value] if isinstance(value, list) else None
    if isinstance(dtype, pl.Struct):
        return {f.name: _coerce(value.get(f.name), f.dtype) for f in dtype.fields} if isinstance(value, dict) else None
    if isinstance(value, bool) or dtype == pl.Boolean:
        return value if isinstance(value, bool) and dtype == pl.Boolean else None
    if dtype == pl.Int64:
        return contract.int64_or_none(value) if isinstance(value, int) else None
    if dtype == pl.Float64:
        return float(value) if isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**1000) else None
    if dtype == pl.String and isinstance(value, str):
        return value.encode("utf-8", "replace").decode()  # lone surrogates from \ud800 escapes
    return None

"""Columnar cache of a run's records, beside the run (docs/records.md, "Columnar cache").

Parsing a big run's JSON lines is most of reading it (7.5 s of 2.56 M step records at
256 ranks × 10,000 steps); the same frame read back from Parquet takes a tenth of a
second. So the reader keeps what it read, once, beside the run:

    RUN_DIR/.syncdoctor/cache/records.json             the index
    RUN_DIR/.syncdoctor/cache/records.<id>/<n>.parquet the step series, one part per rank

the step series as Parquet (zstd), one file per rank file with step records, each with
the columns that hold a value in it, in rank order, read as one by a multi-file scan that
inserts the missing columns as nulls (no merged copy: a
merge of 1,024 parts into one file peaked at 12.2 GiB), and everything else the reader
returned (the other records, its warnings, the ranks, the columns) in the index, which
names the folder of parts. The folder is moved into place, then the index replaced
atomically, so a reader never sees half of one cache and half of another.

The JSON lines stay the source of truth. The cache is used only when its key matches:
the name, size, mtime and inode of every rank file, and a digest of the reader's own
source (a reader that parses differently must not trust what an older one kept). Any
doubt (another key, an unreadable or truncated file, another schema) means the JSON
lines are read again and the cache rewritten; a folder that cannot be written to is
simply not cached, and so are files written in the last seconds. A run with tail files
(a rank running, or killed: records/tail.py) is not cached either: a memory-mapped
tail changes without its size changing. A folder copied elsewhere has new inodes: the
cache it brought is rebuilt, not trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl

from syncdoctor.records import window
from syncdoctor.records.schema import STEP_SCHEMA

CACHE_SUBDIR = Path(".syncdoctor") / "cache"
# The cache's index: its key, what the reader returned besides the step series, and
# the folder of Parquet parts that hold the step series (PARTS_PREFIX + a unique id).
CACHE_FILE = "records.json"
PARTS_PREFIX = "records."
_LEGACY_FILE = "records.parquet"  # format 1: one Parquet file, removed when a new cache is kept
# "0" turns the cache off (on by default: the diagnosis is byte for byte the same with it,
# scripts/compare_diagnose.py --twice).
CACHE_ENV = "SYNCDOCTOR_RECORDS_CACHE"
_FORMAT = 3  # of what this module writes; bump on any change to it
RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")  # the reader's: every file it would read
# A file changed twice within one tick of the file system's clock (a few ms on Linux,
# 2 s on FAT) can keep its size and mtime: files written this recently are not cached
# yet (git's "racily clean" files), the next read will.
RACY_NS = 2_000_000_000
# The modules whose code decides what the reader returns.
_READER_SOURCES = ("reader.py", "schema.py", "contract.py", "tail.py", "constants.py", "cache.py")
# Rows per Parquet row group: big enough to compress well (a part of up to this many
# steps is one row group).
ROW_GROUP = 1 << 17
# Step records a big run's bounded read (records/window.py) holds at once: a batch of
# whole parts (ranks) of about this many records, its columns decoded.
BATCH_ROWS = 2_000_000


def enabled() -> bool:
    return os.environ.get(CACHE_ENV, "1").strip() != "0"


def cache_path(run_dir: Path) -> Path:
    return run_dir / CACHE_SUBDIR / CACHE_FILE


_reader_digest: str | None = None


def _reader_code() -> str:
    global _reader_digest
    if _reader_digest is None:
        digest = hashlib.sha256(str(pl.__version__).encode())
        here = Path(__file__).parent
        for name in _READER_SOURCES:
            try:
                digest.update((here / name).read_bytes())
            except OSError:  # no source beside the module (a frozen install): the version decides
                from syncdoctor.version import __version__

                digest.update(__version__.encode())
        _reader_digest = digest.hexdigest()
    return _reader_digest


def source_key(rec_dir: Path) -> dict[str, Any] | None:
    """What the cache must have been built from, or None when this run is not cached."""
    files = []
    try:
        with os.scandir(rec_dir) as entries:
            for entry in entries:
                if entry.name.endswith(".tail"):
                    return None
                if RANK_FILE.search(entry.name):
                    st = entry.stat()
                    files.append([entry.name, st.st_size, st.st_mtime_ns, st.st_ino])
    except OSError:
        return None
    return {"format": _FORMAT, "reader": _reader_code(), "files": sorted(files)}


def load(run_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The reader's kept result, as the fields of its RunRecords (but run_dir), or None."""
    try:
        meta = json.loads(cache_path(run_dir).read_bytes())
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        warnings = meta["warnings"]
        limit = window.budget()
        if limit and meta["rows"] > limit:
            batches = scan_batches(run_dir, meta, BATCH_ROWS)
            # every part's row count, from the footers: a part that lost rows is not trusted
            if sum(lf.select(pl.len()).collect().item() for lf in batches) != meta["rows"]:
                return None
            # a big run: the steps that matter and a sample of the rest (records/window.py)
            kept = meta.get("triage")
            found = window.Triage.from_json(kept) if kept is not None else None
            steps, note = window.read_bounded(batches, meta["rows"], limit, found)
            warnings = [*warnings, note]
        else:
            steps = scan(run_dir, meta).collect().rechunk()  # one chunk, not one a part
            if steps.height != meta["rows"]:
                return None
        steps = with_null_columns(steps, meta)
        if str(steps.schema) != meta["schema"]:
            return None
        if steps.height:
            # as the reader leaves it (sorted by rank, then step); Parquet does not keep the flag
            steps = steps.with_columns(pl.col("rank").set_sorted())
        return {
            "snapshots": {int(rank): rec for rank, rec in meta["snapshots"]},
            "steps": steps,
            "checks": meta["checks"],
            "events": meta["events"],
            "ends": {int(rank): rec for rank, rec in meta["ends"]},
            "warnings": warnings,
            "ranks": meta["ranks"],
        }
    except Exception:  # missing, truncated, corrupt, unreadable, not ours: read the JSON lines
        return None


def scan(run_dir: Path, meta: dict[str, Any]) -> pl.LazyFrame:
    """The cached step series, lazily: one scan over the parts, in order (rank by rank)."""
    return _scan(run_dir, meta, meta["files"])


def scan_batches(run_dir: Path, meta: dict[str, Any], rows: int) -> list[pl.LazyFrame]:
    """The cached step series as scans of consecutive parts of about ``rows`` step
    records each (one part at least): queries that go through them one at a time hold
    one batch, not the run."""
    batches: list[list[str]] = [[]]
    held = 0
    for name, count in zip(meta["files"], meta["counts"], strict=True):
        if batches[-1] and held + count > rows:
            batches.append([])
            held = 0
        batches[-1].append(name)
        held += count
    return [_scan(run_dir, meta, names) for names in batches]


def _scan(run_dir: Path, meta: dict[str, Any], names: list[str]) -> pl.LazyFrame:
    """The parts ``names``, the columns that hold some value only (the others are null in
    every row: ``with_null_columns`` adds them back after the query, at no cost). A part
    holds the columns with a value in its rows: the scan inserts the others as nulls."""
    folder = run_dir / CACHE_SUBDIR / meta["parts"]
    if not meta["parts"].startswith(PARTS_PREFIX) or "/" in meta["parts"] or not names:
        raise ValueError("not a parts folder of this cache")
    return pl.scan_parquet(
        [folder / name for name in names], schema=pl.Schema(STEP_SCHEMA), missing_columns="insert"
    ).select(meta["valued"])


def with_null_columns(frame: pl.DataFrame, meta: dict[str, Any]) -> pl.DataFrame:
    """``frame`` with the cache's columns that are null in every row, in their place. A
    column of one repeated null is held as a scalar by polars: 13 such columns of a
    bounded read of 700,000 rows took 72 MiB when decoded from Parquet, and nothing this
    way (a query that needs their values makes them)."""
    if not frame.width:  # (a literal would make a row of a frame without columns)
        return pl.DataFrame(schema={name: STEP_SCHEMA[name] for name in meta["columns"]})
    absent = [pl.lit(None, STEP_SCHEMA[name]).alias(name) for name in meta["columns"] if name not in frame.columns]
    return frame.with_columns(absent).select(meta["columns"]) if absent else frame


def racy(key: dict[str, Any]) -> bool:
    """Some rank file was written too recently to be cached (RACY_NS)."""
    return any(mtime >= time.time_ns() - RACY_NS for _, _, mtime, _ in key["files"])


@contextmanager
def parts_folder(run_dir: Path) -> Iterator[Path | None]:
    """A scratch folder in the cache folder for the parts of a cache being built (kept
    by ``publish``, else removed afterwards); None where the run folder cannot be
    written to."""
    folder = run_dir / CACHE_SUBDIR / f".parts.{os.getpid()}.{uuid.uuid4().hex}"
    try:
        folder.mkdir(parents=True)
    except OSError:
        yield None
        return
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_part(frame: pl.DataFrame, path: Path, valued: set[str] | None = None) -> None:
    """One part of the step series: the columns of ``frame`` that hold a value, in
    STEP_SCHEMA's order (a scan of the parts inserts the others as nulls: ``_scan``;
    writing 20 columns of nulls took a third of a part's write). zstd at level 1 and no
    column statistics: a part is one rank's steps, one row group, whose step range every
    query's steps overlap, so statistics never let a read skip anything; without them
    and at level 1 a part is written in two thirds of the time and is smaller (25.5
    against 28.7 bytes per rank-step at 256 ranks × 10,000 steps; 24.6 with only the
    columns that hold a value). A part without rows has every column. ``valued``: the
    frame's columns with a value, where the caller has them."""
    if frame.height:
        valued = valued_columns(frame) if valued is None else valued
        frame = frame.select(name for name in STEP_SCHEMA if name in valued)
    else:
        missing = [pl.lit(None, dtype).alias(name) for name, dtype in STEP_SCHEMA.items() if name not in frame.columns]
        frame = frame.with_columns(missing).select(list(STEP_SCHEMA))
    frame.write_parquet(path, row_group_size=ROW_GROUP, compression="zstd", compression_level=1, statistics=False)


def drop(run_dir: Path) -> None:
    try:
        cache_path(run_dir).unlink(missing_ok=True)
    except OSError:
        pass


def publish(
    run_dir: Path,
    key: dict[str, Any],
    parts_dir: Path,
    files: list[tuple[str, int]],
    schema: pl.Schema,
    records: Any,
    valued: set[str],
    triage: dict[str, Any] | None = None,
) -> bool:
    """Keep the parts in ``parts_dir`` (the step series, rank by rank) as the cache, with
    the rest of the reader's result (a RunRecords, whose steps are unset); ``files``:
    each part's name and rows; ``valued``: the columns with a value in some row;
    ``triage``: the bounded read's first pass (records/window.py Triage), if made. False where
    it could not be kept. The parts' folder is moved into place first, then the index
    that names it replaces the old one atomically: a reader sees the old cache or the
    new one, never half of each."""
    folder = run_dir / CACHE_SUBDIR
    name = f"{PARTS_PREFIX}{uuid.uuid4().hex}"
    tmp = folder / f".{CACHE_FILE}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        meta = _meta(key, sum(n for _, n in files), schema, records)
        meta.update(parts=name, files=[f for f, _ in files], counts=[n for _, n in files])
        meta["valued"] = [column for column in meta["columns"] if column in valued]
        meta["triage"] = triage
        text = json.dumps(meta, separators=(",", ":"))
        os.rename(parts_dir, folder / name)
        tmp.write_text(text)
        os.replace(tmp, folder / CACHE_FILE)
    except Exception:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        shutil.rmtree(folder / name, ignore_errors=True)
        return False
    _tidy(folder)
    return True


def _tidy(folder: Path) -> None:
    """Remove what no reader needs: parts folders the index does not name (an older
    cache, one a concurrent doctor replaced), the scratch folders of conversions that
    were killed (their process is gone, the folder unchanged for _ABANDONED_S), a
    format-1 cache file."""
    try:
        current = json.loads((folder / CACHE_FILE).read_bytes()).get("parts")
        entries = list(folder.iterdir())
    except Exception:
        return
    for entry in entries:
        older = entry.name.startswith(PARTS_PREFIX) and entry.name != current and entry.is_dir()
        if older or (entry.name.startswith(".parts.") and _abandoned(entry)):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name == _LEGACY_FILE:
            entry.unlink(missing_ok=True)


# A scratch folder unchanged this long, of a process that is gone, is a killed conversion's
# (a live one adds a part every second or so; a process of the same number elsewhere, in
# another container sharing the folder, is not judged by this one's process table alone).
_ABANDONED_S = 600


def _abandoned(entry: Path) -> bool:
    try:
        old = entry.stat().st_mtime < time.time() - _ABANDONED_S
    except OSError:
        return False
    return old and not _alive(entry.name.split(".")[2])


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OSError):
        return True  # not ours to judge (another user's process, a name not ours)
    return True


def _meta(key: dict[str, Any], rows: int, schema: pl.Schema, records: Any) -> dict[str, Any]:
    return {
        "key": key,
        "rows": rows,
        "schema": str(schema),
        "columns": list(schema),
        # rank keys become pairs: JSON's keys are strings
        "snapshots": list(records.snapshots.items()),
        "checks": records.checks,
        "events": records.events,
        "ends": list(records.ends.items()),
        "warnings": records.warnings,
        "ranks": records.ranks,
    }


def save(run_dir: Path, key: dict[str, Any], records: Any) -> None:
    """Keep the reader's result (a RunRecords, its steps in memory), a part per rank as
    a conversion leaves it, with the triage of a bounded read: a run that had to be read
    whole once (a corrupt step line, a step twice) is read in bounded batches after.
    Any failure (a read-only folder, a full disk) only means there is no cache."""
    if racy(key):
        return
    steps = records.steps
    valued = valued_columns(steps)
    with parts_folder(run_dir) as parts_dir:
        if parts_dir is None:
            return
        files: list[tuple[str, int]] = []
        try:
            ranks = steps.partition_by("rank", maintain_order=True) if steps.height else [steps]
            for i, part in enumerate(ranks):
                write_part(part, parts_dir / f"{i}.parquet")  # (its own valued columns)
                files.append((f"{i}.parquet", part.height))
        except Exception:
            return
        found = None
        if steps.height:
            tally = window.Tally(steps.schema)
            tally.add(steps.lazy().select(tally.reads(valued)))
            found = tally.triage().to_json()
        publish(run_dir, key, parts_dir, files, steps.schema, records, valued, found)


def valued_columns(frame: pl.DataFrame) -> set[str]:
    """The columns of ``frame`` with a value (not null) in some row."""
    return {name for name in frame.columns if frame[name].null_count() < frame.height}

"""Columnar cache of a run's records, beside the run (docs/records.md, "Columnar cache").

Parsing a big run's JSON lines is most of reading it (7.5 s of 2.56 M step records at
256 ranks × 10,000 steps); the same frame read back from Parquet takes a tenth of a
second. So the reader keeps what it read, once, in

    RUN_DIR/.syncdoctor/cache/records.parquet

the step series as Parquet (zstd), and everything else the reader returned (the other
records, its warnings, the ranks) as JSON in the file's key-value metadata: one file,
replaced atomically, so a reader never sees half of one and half of another.

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

CACHE_SUBDIR = Path(".syncdoctor") / "cache"
CACHE_FILE = "records.parquet"
# "0" turns the cache off (on by default: the diagnosis is byte for byte the same with it,
# scripts/compare_diagnose.py --twice).
CACHE_ENV = "SYNCDOCTOR_RECORDS_CACHE"
_META_KEY = "syncdoctor.records"
_FORMAT = 1  # of what this module writes; bump on any change to it
RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")  # the reader's: every file it would read
# A file changed twice within one tick of the file system's clock (a few ms on Linux,
# 2 s on FAT) can keep its size and mtime: files written this recently are not cached
# yet (git's "racily clean" files), the next read will.
RACY_NS = 2_000_000_000
# The modules whose code decides what the reader returns.
_READER_SOURCES = ("reader.py", "schema.py", "contract.py", "tail.py", "constants.py", "cache.py")


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
    path = cache_path(run_dir)
    try:
        raw = pl.read_parquet_metadata(path).get(_META_KEY)
        if raw is None:
            return None
        meta = json.loads(raw)
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        warnings = meta["warnings"]
        limit = window.budget()
        if limit and meta["rows"] > limit:
            # a big run: the steps that matter and a sample of the rest (records/window.py)
            steps, note = window.read_bounded(path, meta["rows"], limit)
            if str(steps.schema) != meta["schema"]:
                return None
            warnings = [*warnings, note]
        else:
            steps = pl.read_parquet(path)
            if steps.height != meta["rows"] or str(steps.schema) != meta["schema"]:
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


def racy(key: dict[str, Any]) -> bool:
    """Some rank file was written too recently to be cached (RACY_NS)."""
    return any(mtime >= time.time_ns() - RACY_NS for _, _, mtime, _ in key["files"])


@contextmanager
def parts_folder(run_dir: Path) -> Iterator[Path | None]:
    """A scratch folder in the cache folder for the parts of a cache being built, removed
    afterwards; None where the run folder cannot be written to."""
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


def drop(run_dir: Path) -> None:
    try:
        cache_path(run_dir).unlink(missing_ok=True)
    except OSError:
        pass


def save_lazy(
    run_dir: Path, key: dict[str, Any], steps: pl.LazyFrame, rows: int, schema: pl.Schema, records: Any
) -> bool:
    """Keep a step frame that is not in memory (the reader's parts, streamed into one
    file) with the rest of the reader's result (a RunRecords, whose steps are unset);
    False where it could not be written."""
    folder = run_dir / CACHE_SUBDIR
    tmp = folder / f".{CACHE_FILE}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        text = json.dumps(_meta(key, rows, schema, records), separators=(",", ":"))
        folder.mkdir(parents=True, exist_ok=True)
        steps.sink_parquet(tmp, metadata={_META_KEY: text}, row_group_size=ROW_GROUP)
        os.replace(tmp, folder / CACHE_FILE)
        return True
    except Exception:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False


# Rows per Parquet row group: small enough that a query reading a few steps of a few
# ranks decodes little more than it needs, big enough to compress well.
ROW_GROUP = 1 << 17


def _meta(key: dict[str, Any], rows: int, schema: pl.Schema, records: Any) -> dict[str, Any]:
    return {
        "key": key,
        "rows": rows,
        "schema": str(schema),
        # rank keys become pairs: JSON's keys are strings
        "snapshots": list(records.snapshots.items()),
        "checks": records.checks,
        "events": records.events,
        "ends": list(records.ends.items()),
        "warnings": records.warnings,
        "ranks": records.ranks,
    }


def save(run_dir: Path, key: dict[str, Any], records: Any) -> None:
    """Keep the reader's result (a RunRecords); any failure (a read-only folder, a full
    disk) only means there is no cache."""
    if racy(key):
        return
    folder = run_dir / CACHE_SUBDIR
    tmp = folder / f".{CACHE_FILE}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        meta = _meta(key, records.steps.height, records.steps.schema, records)
        text = json.dumps(meta, separators=(",", ":"))
        folder.mkdir(parents=True, exist_ok=True)
        records.steps.write_parquet(tmp, metadata={_META_KEY: text})
        os.replace(tmp, folder / CACHE_FILE)
    except Exception:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass

"""Tolerant reader of probe run folders into polars frames.

Step records (the bulk: ranks × steps) go straight to polars with a fixed schema;
the few other records are parsed with json. A truncated last line, a corrupt line or
a rank file that is missing becomes a warning, never an exception.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from syncdoctor.records.schema import RECORDS_SUBDIR, SCHEMA_VERSION, STEP_SCHEMA, RecordError

_RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")
_STEP_PREFIX = b'{"v":1,"kind":"step"'


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
        sizes = {s.get("world_size") for s in self.snapshots.values()} - {None}
        return max(sizes) if sizes else (max(self.ranks) + 1 if self.ranks else None)


def is_run_dir(path: Path) -> bool:
    return (path / RECORDS_SUBDIR).is_dir() and any((path / RECORDS_SUBDIR).glob("rank*.jsonl"))


def read_run(run_dir: str | Path) -> RunRecords:
    run_dir = Path(run_dir)
    rec_dir = run_dir / RECORDS_SUBDIR
    if not rec_dir.is_dir():
        raise RecordError(f"{run_dir}: no {RECORDS_SUBDIR}/ folder with rank*.jsonl files")
    files = sorted(
        ((int(m.group(1)), p) for p in rec_dir.iterdir() if (m := _RANK_FILE.search(p.name))),
    )
    if not files:
        raise RecordError(f"{rec_dir}: no rank*.jsonl record files")
    out = RunRecords(run_dir=run_dir)
    step_chunks: list[bytes] = []
    for rank, path in files:
        out.ranks.append(rank)
        step_chunks.append(_read_rank_file(rank, path, out))
    out.steps = _parse_steps(b"".join(step_chunks), out)
    world = out.world_size
    if world:
        missing = sorted(set(range(world)) - set(out.ranks))
        if missing:
            out.warnings.append(f"no record file for ranks {missing} of world size {world}")
    return out


def _read_rank_file(rank: int, path: Path, out: RunRecords) -> bytes:
    """Split one rank's file: step lines are returned as bytes, the rest parsed here."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        out.warnings.append(f"{path}: unreadable ({exc.strerror})")
        return b""
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
    steps = [line for line in lines if line.startswith(_STEP_PREFIX)]
    others = [(n, line) for n, line in enumerate(lines, 1) if not line.startswith(_STEP_PREFIX) and line.strip()]
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
        if rec.get("v") != SCHEMA_VERSION:
            raise RecordError(
                f"{path}:{lineno}: record schema version {rec.get('v')!r} is not supported "
                f"(this syncdoctor reads version {SCHEMA_VERSION})"
            )
        kind = rec.get("kind")
        rec.setdefault("rank", rank)
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
    return b"\n".join(steps) + b"\n" if steps else b""


def _parse_steps(blob: bytes, out: RunRecords) -> pl.DataFrame:
    if not blob:
        return pl.DataFrame(schema=STEP_SCHEMA)
    try:
        frame = pl.read_ndjson(io.BytesIO(blob), schema=STEP_SCHEMA, ignore_errors=True)
    except Exception:  # a corrupt line inside: fall back to line by line
        rows = []
        for line in blob.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            rows.append({k: rec.get(k) for k in STEP_SCHEMA})
        out.warnings.append("some step records were corrupt and skipped")
        frame = pl.DataFrame(rows, schema=STEP_SCHEMA, strict=False)
    return frame.sort(["rank", "step"])

"""The parts of the record format the writer needs, without polars: the probe runs
inside every training process and must import fast (schema.py holds the frame types)."""

from __future__ import annotations

import os
from pathlib import Path

SCHEMA_VERSION = 1
RECORDS_SUBDIR = "records"
KINDS = ("snapshot", "step", "check", "event", "end")
MAX_IDS = 1024  # sample ids kept per step record (the doctor's overlap check); larger batches keep a fingerprint


def records_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / RECORDS_SUBDIR / f"rank{rank}.jsonl"

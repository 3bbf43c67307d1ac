"""Which files to read, and what their paths say about rank and host.

Users hand the doctor whatever they have: one log, a folder of per-rank logs, a
torchrun log tree, an msrun log_dir, a probe run folder. Folders are walked;
files that are clearly not logs (code, configs, checkpoints, images) are left
out, and files that look binary are skipped with a warning. A file named
explicitly is always read: the user asked for it.
"""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

SNIFF_BYTES = 8192

# Extensions a log may carry. Anything with a numeric tail (train.log0,
# train.log.1, worker.3) or no extension at all (stdout, stderr) counts too.
_LOG_EXTS = {".log", ".txt", ".out", ".err", ".stdout", ".stderr", ".jsonl", ".trace"}
_NUMERIC_TAIL = re.compile(r"\.(?:log|txt|out|err)?[._-]?\d+$", re.IGNORECASE)
_BARE_LOG_NAME = re.compile(r"std(?:out|err)|out|err|log|rank|worker|node|train|device|^\d+$", re.IGNORECASE)
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages", "checkpoints", "ckpt"}
HF_TRAINER_STATE = "trainer_state.json"

# Rank in a path, strongest first. Only the file name and the three nearest
# folders are looked at, so a rank-looking folder far up the tree (a user's
# "rank3_experiments" home) does not leak into every file under it.
_NAME_RANK = (
    re.compile(
        r"(?:^|[^a-z])rank[._-]?(\d{1,5})(?![\d])", re.IGNORECASE
    ),  # rank1.log, log_rank_3.txt, node1_rank7.log, rank.0/
    # train.log0, train.log_1; not train.log.1, which is how logrotate names old logs
    re.compile(r"\.log[_-]?(\d{1,5})$", re.IGNORECASE),
    re.compile(
        r"(?:^|[^a-z])(?:worker|device|npu|gpu|proc|process)[._-]?(\d{1,5})(?![\d])", re.IGNORECASE
    ),  # worker_0.log, device3/
    re.compile(r"(?:^|[^a-z])log[_-](\d{1,5})(?![\d])", re.IGNORECASE),  # train_log_1.txt, log_2.txt
)
_ATTEMPT_DIR = re.compile(r"^attempt_\d+$")
_HOST = re.compile(r"(?:^|[^a-z])((?:node|host)[._-]?\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LogFile:
    path: Path
    rank: int | None  # from the path; a line prefix still wins
    host: str | None
    explicit: bool  # named by the user, not found by walking a folder

    @property
    def source(self) -> str:
        return str(self.path)

    @property
    def compressed(self) -> bool:
        return self.path.name.lower().endswith(".gz")

    @property
    def is_trainer_state(self) -> bool:
        return self.path.name == HF_TRAINER_STATE


def rank_from_path(path: Path) -> int | None:
    """Rank written into a log's path, or None.

    torchrun's ``--log-dir`` tree is ``…/attempt_N/<local_rank>/stdout.log``: a bare
    number under ``attempt_N`` is the (local) rank, equal to the rank on one node.
    """
    parts = path.parts
    name = _strip_gz(parts[-1]) if parts else ""
    if len(parts) >= 3 and parts[-2].isdigit() and _ATTEMPT_DIR.match(parts[-3]):
        return int(parts[-2])
    candidates = [name, *reversed(parts[-4:-1])]
    for pattern in _NAME_RANK:
        for part in candidates:
            m = pattern.search(part)
            if m:
                return int(m.group(1))
    return None


def host_from_path(path: Path) -> str | None:
    for part in reversed(path.parts[-4:]):
        m = _HOST.search(_strip_gz(part))
        if m:
            return m.group(1)
    return None


def _strip_gz(name: str) -> str:
    return name[:-3] if name.lower().endswith(".gz") else name


def looks_like_log_name(path: Path) -> bool:
    name = _strip_gz(path.name)
    if name == HF_TRAINER_STATE:
        return True
    suffix = Path(name).suffix.lower()
    if suffix in _LOG_EXTS or _NUMERIC_TAIL.search(name):
        return True
    # stdout, stderr, output, rank0 ... without an extension; not README, Makefile
    return suffix == "" and bool(_BARE_LOG_NAME.search(name))


def open_binary(path: Path) -> BinaryIO:
    """Open a log for streaming bytes; .gz logs are decompressed on the fly."""
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


# Bytes that text holds: printable, high bytes (UTF-8, or GBK and other legacy
# encodings seen on Chinese systems), and the usual whitespace/ANSI escape.
_TEXT_BYTES = bytes(range(32, 256)) + b"\t\n\r\f\v\x1b"


def looks_binary(head: bytes) -> bool:
    """True for data that is not text: NUL bytes or many control bytes.

    Undecodable high bytes do not count: a GBK-encoded log is still a log.
    """
    if not head:
        return False
    if head.count(0) > max(1, len(head) // 1000):
        return True
    control = len(head.translate(None, delete=_TEXT_BYTES))
    return control > 0.1 * len(head)


def _natural_key(path: Path) -> list[object]:
    # rank10 after rank9, not after rank1
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", str(path))]


def _is_probe_records(dirpath: Path) -> bool:
    return dirpath.name == "records" and any(dirpath.glob("rank*.jsonl"))


def discover(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[LogFile], list[str]]:
    """Resolve user paths into log files to read, with warnings for what was skipped."""
    files: list[LogFile] = []
    warnings: list[str] = []
    seen: set[Path] = set()

    def add(path: Path, explicit: bool) -> None:
        try:
            key = path.resolve()
        except OSError:
            key = path
        if key in seen:
            return
        seen.add(key)
        files.append(LogFile(path, rank_from_path(path), host_from_path(path), explicit))

    for raw in paths:
        path = Path(raw)
        if path.is_file():
            add(path, explicit=True)
            continue
        if not path.is_dir():
            warnings.append(f"{path}: no such file or folder")
            continue
        found: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(
            path, onerror=lambda e: warnings.append(f"{e.filename}: {e.strerror}")
        ):
            here = Path(dirpath)
            # The probe's records are read by the records reader, not as logs.
            dirnames[:] = [
                d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS and not _is_probe_records(here / d)
            ]
            for name in filenames:
                child = here / name
                if name.startswith(".") or not child.is_file():
                    continue
                # code, configs and data beside the logs are normal: skipped silently
                if looks_like_log_name(child):
                    found.append(child)
        for child in sorted(found, key=_natural_key):
            add(child, explicit=False)
        if not found:
            warnings.append(f"{path}: no log files in this folder")
    return files, warnings

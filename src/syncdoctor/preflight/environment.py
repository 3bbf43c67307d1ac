"""Per-rank environment snapshots: the first (snapshot) record of each
`records/rank*.jsonl` of a probe run, or a folder of `KEY=VALUE` dumps, one file
per rank (`*.env`, `env*.txt`, e.g. `env > env_rank3.txt` in the launch script)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")
_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
# The keys that name the node a rank runs on, best first.
HOST_KEYS = ("HOSTNAME", "HOST", "SERVER_ID", "NODE_RANK", "GROUP_RANK", "SLURM_NODEID")


class EnvInputError(ValueError):
    """A snapshot file that must not be read (another record schema version)."""


@dataclass
class EnvSnapshot:
    path: str
    line: int
    env: dict[str, str]
    host: str | None = None  # from the record, or one of HOST_KEYS
    record: dict[str, Any] = field(default_factory=dict)  # the whole snapshot record, if any

    def get(self, *keys: str) -> str | None:
        """The first of `keys` that is set, stripped."""
        for key in keys:
            value = self.env.get(key)
            if value is not None and value.strip() != "":
                return value.strip()
        return None

    def get_int(self, *keys: str) -> int | None:
        value = self.get(*keys)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    @property
    def node(self) -> str:
        """The node key: ranks with equal keys share devices."""
        if self.host:
            return self.host
        for key in HOST_KEYS:
            if self.env.get(key):
                return f"{key}={self.env[key]}"
        return "?"  # unknown: dumps without host information are taken as one node


@dataclass
class EnvGroup:
    """The snapshots of one job: a run folder or a folder of dumps."""

    root: str
    snapshots: list[EnvSnapshot] = field(default_factory=list)


def is_env_dump(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith(".env") or (name.startswith("env") and name.endswith(".txt"))


def is_record_file(path: Path) -> bool:
    return path.parent.name == "records" and bool(_RANK_FILE.search(path.name))


def read_env_dump(path: Path) -> EnvSnapshot:
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = _ENV_LINE.match(line)
        if m:
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[m.group(1)] = value
    snap = EnvSnapshot(str(path), 1, env)
    snap.host = snap.get("HOSTNAME", "HOST")
    return snap


def read_record_snapshot(path: Path) -> EnvSnapshot | None:
    """The snapshot record of one rank file; None when the file has none."""
    from syncdoctor.records.schema import SCHEMA_VERSION

    with path.open("rb") as fh:
        first = fh.readline()
    try:
        rec = json.loads(first)
    except (ValueError, UnicodeDecodeError):
        return None  # empty or truncated: the reader's problem, not a preflight finding
    if not isinstance(rec, dict):
        return None
    if rec.get("v") != SCHEMA_VERSION:
        raise EnvInputError(
            f"{path}:1: record schema version {rec.get('v')!r} is not supported "
            f"(this syncdoctor reads version {SCHEMA_VERSION})"
        )
    if rec.get("kind") != "snapshot" or not isinstance(rec.get("env"), dict):
        return None
    env = {str(k): str(v) for k, v in rec["env"].items() if v is not None}
    return EnvSnapshot(str(path), 1, env, host=rec.get("host") or None, record=rec)


def group_snapshots(files: list[Path]) -> list[EnvGroup]:
    """Group env dumps by folder and record files by run folder, in path order."""
    groups: dict[str, EnvGroup] = {}
    for path in sorted(files):
        if is_record_file(path):
            root, snap = str(path.parent.parent), read_record_snapshot(path)
        else:
            root, snap = str(path.parent), read_env_dump(path)
        if snap is not None:
            groups.setdefault(root, EnvGroup(root)).snapshots.append(snap)
    return list(groups.values())

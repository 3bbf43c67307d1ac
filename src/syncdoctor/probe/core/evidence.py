"""The evidence bundle written on a mismatch (on_mismatch = dump | raise): the
playbook's habit of keeping the scene before anything is restarted.

One JSON file per rank: RUN_DIR/evidence/step{S}.rank{R}.json with what every rank
reported at the check (counters, fingerprints, losses, gradient norms), this rank's
own counters and recent losses, the differences between the ranks' start-of-run
snapshots that this rank can read (same file system), and the tail of its log.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from syncdoctor.probe.core.verdict import PER_RANK_DETAIL
from syncdoctor.records.constants import RECORDS_SUBDIR


class EvidenceSource(Protocol):
    """What a probe of either framework offers the bundle."""

    run_dir: Path
    log_path: Path | None
    rank: int
    world_size: int
    step: int
    backward: int
    opt_steps: int
    last_grad_norm: float | None

    @property
    def last_losses(self) -> list[tuple[int, float | None]]: ...


LOG_TAIL_LINES = 50
LAST_LOSSES = 32  # recent losses a probe keeps for the bundle
# Fields that differ between ranks by design, not by mistake.
_PER_RANK = {"rank", "local_rank", "pid", "t", "host", "rng", "init_param_fp_local"}
_PER_RANK_ENV = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "RANK_ID",
    "DEVICE_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "PMI_RANK",
    "HOSTNAME",
    "TORCHELASTIC_ERROR_FILE",
    "CUDA_VISIBLE_DEVICES",
    "MS_NODE_ID",
)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def read_snapshots(run_dir: Path) -> dict[int, dict[str, Any]]:
    """Each rank's snapshot: the first line of its record file (cheap, no full read)."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((run_dir / RECORDS_SUBDIR).glob("rank*.jsonl")):
        try:
            with open(path, "rb") as fh:
                rec = json.loads(fh.readline())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("kind") == "snapshot" and isinstance(rec.get("rank"), int):
            out[rec["rank"]] = rec
    return out


def snapshot_differences(snapshots: dict[int, dict[str, Any]], limit: int = 100) -> dict[str, dict[int, Any]]:
    """Fields whose values differ between ranks, leaving out those that differ by design."""
    flat: dict[int, dict[str, Any]] = {}
    for rank, snap in snapshots.items():
        fields: dict[str, Any] = {}
        _flatten({k: v for k, v in snap.items() if k not in _PER_RANK}, "", fields)
        flat[rank] = {k: v for k, v in fields.items() if not (k.startswith("env.") and k[4:] in _PER_RANK_ENV)}
    keys = sorted(set().union(*flat.values())) if flat else []
    diffs: dict[str, dict[int, Any]] = {}
    for key in keys:
        values = {rank: fields.get(key) for rank, fields in flat.items()}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            diffs[key] = values
            if len(diffs) >= limit:
                break
    return diffs


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    if path is None or not path.is_file():
        return []
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 256 * 1024))
            tail: deque[bytes] = deque(fh, maxlen=lines)
    except OSError:
        return []
    return [line.decode("utf-8", "replace").rstrip("\n") for line in tail]


def dump_evidence(probe: EvidenceSource, follow: dict[str, Any], tensor: str | None) -> Path:
    folder = probe.run_dir / "evidence"
    folder.mkdir(parents=True, exist_ok=True)
    detail = follow.get("detail") or {}
    log_path = probe.log_path or probe.run_dir / "logs" / f"rank{probe.rank}.log"
    bundle = {
        "step": follow["step"],
        "what": follow["what"],
        "ranks": follow["ranks"],
        "tensor": tensor,
        "message": follow.get("message"),
        "rank": probe.rank,
        "world_size": probe.world_size,
        "t": time.time(),
        "per_rank": {name: detail.get(name) for name in PER_RANK_DETAIL if name in detail},
        "counters": {"step": probe.step, "backward": probe.backward, "opt_steps": probe.opt_steps},
        "last_losses": list(probe.last_losses),
        "last_grad_norm": probe.last_grad_norm,
        "snapshot_differences": snapshot_differences(read_snapshots(probe.run_dir)),
        "log": str(log_path) if log_path.is_file() else None,
        "log_tail": log_tail(log_path),
    }
    path = folder / f"step{follow['step']}.rank{probe.rank}.json"
    path.write_text(json.dumps(bundle, indent=1, default=str))
    return path

"""Inputs for the fuzzers and the size tests: splitting one fuzz input into the
files of a run folder, a small synthetic probe run, and the seed corpus.

One fuzz input holds several files separated by SEP; a harness names them by
position. Seeds are real inputs (tests/fixtures, the rank tables of tests/rules/_shared,
plus the synthetic run), so the fuzzer starts from files the parsers accept and
mutates inward from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

SEP = b"\n--8<--\n"
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
LOG_NAMES = ("train.log0", "train.log1", "rank2.log", "node1/worker_3.log", "stdout")


def split(data: bytes, limit: int = 8) -> list[bytes]:
    return data.split(SEP)[:limit]


def log_files(chunks: Sequence[bytes]) -> dict[str, bytes]:
    return {LOG_NAMES[i % len(LOG_NAMES)] + ("" if i < len(LOG_NAMES) else f".{i}"): c for i, c in enumerate(chunks)}


def record_files(chunks: Sequence[bytes]) -> dict[str, bytes]:
    return {f"rank{i}.jsonl": c for i, c in enumerate(chunks)}


def _line(**fields: object) -> bytes:
    return json.dumps({"v": 1, **fields}, separators=(",", ":")).encode() + b"\n"


def synthetic_records(world: int = 2, steps: int = 12) -> list[bytes]:
    """One small healthy probe run, one rank file each (written here rather than by
    the probe so the fuzz seeds do not depend on torch)."""
    files = []
    for rank in range(world):
        lines = [
            _line(
                kind="snapshot",
                rank=rank,
                world_size=world,
                local_rank=rank,
                framework="torch",
                t=1.0e9,
                env={"RANK": str(rank)},
                loader={"dataset_len": 96, "batch_size": 4, "num_replicas": world},
                optimizer={"type": "SGD", "param_groups": [{"lr": 0.1}], "n_params": 2},
                loss={"type": "CrossEntropyLoss", "params": {}},
                init_param_fp=7,
                check_every=5,
                tensors=["w", "b"],
                seed={"torch": 0},
            )
        ]
        for s in range(1, steps + 1):
            lines.append(
                _line(
                    kind="step",
                    rank=rank,
                    step=s,
                    micro=1,
                    backward=s,
                    t=1.0e9 + s,
                    loss=2.0 / s + 0.01 * rank,
                    lr=0.1,
                    grad_norm=1.0,
                    grad_norm_local=1.4,
                    reduce_ratio=0.7,
                    param_fp=s,
                    opt_fp=s,
                    grad_fp=s,
                    data_fp=100 * rank + s,
                    samples=4,
                    overflow=False,
                    opt_steps=s,
                    train_mode="1/1",
                    ids=[rank * 4 + s],
                )
            )
            if s % 5 == 0:
                lines.append(
                    _line(kind="check", rank=rank, step=s, status="ok", what=[], ranks=[], tensor=None, detail={})
                )
        lines.append(_line(kind="event", rank=rank, t=1.0e9 + steps, step=steps, event="retry", message="hcom retry 1"))
        lines.append(_line(kind="end", rank=rank, step=steps, t=1.0e9 + steps + 1, status="ok", message=""))
        files.append(b"".join(lines))
    return files


def _fixture_logs() -> list[bytes]:
    return [p.read_bytes() for p in sorted((FIXTURES / "logs").rglob("*")) if p.is_file()]


def seeds(target: str) -> list[bytes]:
    if target == "logs":
        logs = _fixture_logs()
        return logs + [SEP.join(logs[i : i + 2]) for i in range(0, len(logs), 2)]
    if target == "records":
        return [SEP.join(synthetic_records()), SEP.join(synthetic_records(world=4, steps=6))]
    if target == "rank_table":
        return [p.read_bytes() for p in sorted((REPO / "tests" / "rules" / "_shared" / "rank_tables").glob("*.json"))]
    if target == "diagnose":
        logs = _fixture_logs()
        return [SEP.join(synthetic_records()) + SEP + logs[0]] + logs[:4]
    raise ValueError(target)

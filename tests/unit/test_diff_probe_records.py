"""scripts/diff_probe_records.py: two runs of a seeded job agree where only times,
ports and the order in which check blocks were read differ; a changed field shows."""

from __future__ import annotations

import json
from pathlib import Path

from tests.scripts import load_script


def _script():  # noqa: ANN202 - a module loaded from a script path
    return load_script("diff_probe_records")


def _run(folder: Path, records: list[dict[str, object]]) -> Path:
    (folder / "records").mkdir(parents=True)
    (folder / "records" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_times_ports_and_read_order_are_not_differences_a_field_is(tmp_path: Path) -> None:
    diff = _script().differences
    snapshot = {"kind": "snapshot", "env": {"MASTER_PORT": "1"}, "rng": {"python": "a", "torch": "t"}}
    step = {"kind": "step", "step": 1, "t": 1.0, "param_fp": 7}
    check = {"kind": "check", "step": 1, "status": "ok", "detail": {"waited_s": 0.1}}
    a = _run(tmp_path / "a", [snapshot, step, check])
    moved = {**snapshot, "env": {"MASTER_PORT": "2"}, "rng": {"python": "b", "torch": "t"}}
    b = _run(tmp_path / "b", [moved, check, {**step, "t": 2.0}])
    assert diff(a, b) == []
    c = _run(tmp_path / "c", [snapshot, {**step, "param_fp": 8}, check])
    assert len(diff(a, c)) == 1 and "param_fp" in diff(a, c)[0]
    d = _run(tmp_path / "d", [{**snapshot, "rng": {"torch": "u"}}, step, check])
    assert len(diff(a, d)) == 1

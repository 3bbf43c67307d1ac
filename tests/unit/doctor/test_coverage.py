"""The verdict says what it covered: the steps after the last check, and a loss nobody
recorded, are said beside the verdict, never folded into "healthy"."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.report.html import render_html
from tests.unit.doctor.test_rules_records import write_run


def _rewrite(run: Path, change: Callable[[dict[str, Any]], dict[str, Any]]) -> Path:
    for path in (run / "records").glob("rank*.jsonl"):
        lines = [change(json.loads(line)) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def _checked_at(*steps: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Parameters fingerprinted only at `steps`, as the probe does at check steps."""

    def change(record: dict[str, Any]) -> dict[str, Any]:
        if record.get("kind") == "step" and record["step"] not in steps:
            record.pop("param_fp", None)
        if record.get("kind") == "check":
            record["step"] = max(steps)  # an ok record vouches up to the last check it read
        return record

    return change


def _no_loss(record: dict[str, Any]) -> dict[str, Any]:
    if record.get("kind") == "step":
        record["loss"] = None
    return record


def test_steps_after_the_last_check_are_named_as_not_compared(tmp_path: Path) -> None:
    run = _rewrite(write_run(tmp_path / "tail", [{}, {}], steps=84), _checked_at(1, 50))
    diag = diagnose([str(run)])
    assert diag.verdict == "healthy"
    assert diag.coverage[0] == "replicas compared at 2 checks, steps 1-50"
    assert diag.coverage[1].startswith("steps 51-84 ran after the last check and were not compared")
    assert "What was checked" in render_html(diag) and "steps 51-84" in render_html(diag)
    assert diag.to_json()["coverage"] == diag.coverage


def test_a_run_checked_to_its_last_step_has_no_tail_to_name(tmp_path: Path) -> None:
    run = _rewrite(write_run(tmp_path / "whole", [{}, {}], steps=50), _checked_at(1, 50))
    diag = diagnose([str(run)])
    assert diag.verdict == "healthy"
    assert diag.coverage == ["replicas compared at 2 checks, steps 1-50"]


def test_records_with_no_loss_on_any_rank_are_inconclusive_not_healthy(tmp_path: Path) -> None:
    run = _rewrite(write_run(tmp_path / "noloss", [{}, {}], steps=50), _no_loss)
    diag = diagnose([str(run)])
    assert diag.verdict == "inconclusive"
    assert any(line.startswith("no rank's loss was recorded") for line in diag.coverage)


def test_one_rank_without_loss_is_not_a_gap_of_the_job(tmp_path: Path) -> None:
    """Near miss: rank 1 printed no loss (a rank-0-only logger), rank 0 did."""
    run = write_run(tmp_path / "oneloss", [{}, {}], steps=50, step_fields={1: {"loss": None}})
    diag = diagnose([str(run)])
    assert diag.verdict == "healthy"
    assert not any("loss was recorded" in line for line in diag.coverage)


def test_a_run_folder_where_no_rank_attached_is_inconclusive_not_an_input_error(tmp_path: Path) -> None:
    """`syncdoctor run` around a command that never became a rank (here one that is no
    Python at all; `accelerate launch --cpu` starts one process) leaves run.json and no
    records: nothing was observed, and the diagnosis says that instead of failing on it."""
    import subprocess
    import sys

    import pytest

    from syncdoctor.errors import InputError

    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "syncdoctor", "run", "--out", str(out), "--", "true"], check=True)
    diag = diagnose([out])
    assert diag.verdict == "inconclusive" and not diag.findings, diag.findings
    assert any("no rank attached, so nothing was recorded" in w for w in diag.warnings), diag.warnings
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        diagnose([empty])

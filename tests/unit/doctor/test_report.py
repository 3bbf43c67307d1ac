"""Terminal and JSON renderers, and the size/time of a big HTML report."""

from __future__ import annotations

import gc
import json
import math
import sys
from pathlib import Path

import pytest
from rich.console import Console

from syncdoctor.doctor.model import DIAGNOSIS_SCHEMA, Diagnosis, Finding, RankSummary
from syncdoctor.doctor.report import render_html, render_json, render_terminal
from syncdoctor.doctor.report.common import clean, fmt_num
from syncdoctor.doctor.series import downsample
from syncdoctor.rulebook import fmt_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "report"))
from hostile import (  # noqa: E402
    ANSI_CLEAR,
    ANSI_TITLE,
    OSC8_LINK,
    TOP_TITLE,
    big_diagnosis,
    hostile_diagnosis,
)


def _terminal(diag: Diagnosis) -> tuple[str, str]:
    console = Console(record=True, width=120, force_terminal=True, color_system="truecolor")
    render_terminal(diag, console)
    styled = console.export_text(styles=True, clear=False)
    return console.export_text(), styled


def test_terminal_shows_verdict_and_top_cause():
    plain, _ = _terminal(hostile_diagnosis())
    assert "Sync problem" in plain
    assert TOP_TITLE in plain
    for fact in ("SYNC001", "sync.incomplete_reduce", "confidence 90 %", "step 25", "rank 3"):
        assert fact in plain
    assert "Evidence" in plain and "Fix" in plain
    assert "Other findings" in plain and "DATA002" in plain
    assert "Per rank" in plain and "stalled" in plain
    assert "retry 1" in plain and "(1 benign)" in plain
    assert "Input warnings" in plain
    assert "sawtooth" in plain


def test_terminal_strips_control_sequences_and_ignores_markup():
    plain, styled = _terminal(hostile_diagnosis())
    # Our own styling is the only escape sequence left: no OSC (title/hyperlink),
    # no screen clear, no raw BEL, and the hostile colour code is gone.
    assert "\x1b]" not in styled and "\x07" not in styled
    assert "\x1b[2J" not in styled
    assert "owned-terminal-title" not in plain
    assert "\x1b" not in plain
    assert "[bold]not bold[/bold]" in plain
    assert "[link=javascript:alert(1)]x[/link]" in plain
    assert ":smile:" in plain and "😄" not in plain
    assert "\u202e" not in plain and "safetxt.exe" in plain


def test_terminal_big_run_lists_only_ranks_that_stand_out():
    diag = Diagnosis(
        verdict="healthy",
        loss_shape=None,
        ranks=[RankSummary(r, steps=10, status="ok") for r in range(100)]
        + [RankSummary(100, steps=3, status="crashed", note="OOM")],
    )
    plain, _ = _terminal(diag)
    assert "crashed" in plain
    assert "100 more rank(s)" in plain
    assert "No findings." in plain


def test_big_run_reports_name_the_odd_ranks_and_sum_up_the_others():
    """1,024 ranks: the terminal and the HTML list the ranks that stand out and give
    the others' envelope in one line (the range of each column), never 1,024 rows."""
    ranks = [RankSummary(r, steps=1000, last_loss=1.0 + r / 1024, mean_loss=2.0, status="ok") for r in range(1024)]
    ranks[517] = RankSummary(517, steps=600, last_loss=9.0, status="crashed", note="killed")
    diag = Diagnosis(verdict="healthy", loss_shape=None, ranks=ranks)
    envelope = (
        "1023 more rank(s) look ordinary and are not listed: steps 1000; last loss 1–1.999 (median 1.499); mean loss 2"
    )
    plain, _ = _terminal(diag)
    assert envelope in " ".join(plain.split())
    page = render_html(diag)
    assert envelope in page
    table = page[page.index('<section id="ranks">') :]
    table = table[: table.index("</section>")]
    assert table.count("<tr>") == 2 and "killed" in table  # the header and rank 517


def test_clean_and_formatting_helpers():
    assert clean("a" + ANSI_TITLE + "b" + ANSI_CLEAR + "c") == "abc"
    assert clean(OSC8_LINK) == "click"
    assert clean("x\x1b]0;never ended") == "x"
    assert clean("l1\r\nl2\rl3", oneline=True) == "l1 ⏎ l2 ⏎ l3"
    assert clean("abcdef", limit=4) == "abc…"
    assert clean("\x9b31mC1\x00") == "31mC1"
    assert [fmt_num(v) for v in (None, math.nan, math.inf, -math.inf, 3, 0.123456)] == [
        "—",
        "nan",
        "inf",
        "-inf",
        "3",
        "0.1235",
    ]
    assert fmt_ranks([5, 0, 1, 2, 7, 8]) == "ranks 0-2, 5, 7, 8"
    assert fmt_ranks([3]) == "rank 3"


def test_json_is_strict_stable_and_nan_safe():
    diag = hostile_diagnosis()
    text = render_json(diag, include_series=True)
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    assert data["schema"] == DIAGNOSIS_SCHEMA
    assert list(data)[:3] == ["schema", "verdict", "loss_shape"]
    assert data["loss_shape"]["trend"] is None  # inf
    assert data["ranks"][1]["last_loss"] is None and data["ranks"][2]["last_loss"] == 1e308
    assert data["ranks"][1]["grad_norm"] == 0.0 and math.copysign(1, data["ranks"][1]["grad_norm"]) < 0
    assert data["loss_series"]["1"][30] == [30.0, None]
    assert data["findings"][1]["confidence"] is None
    assert list(data["loss_series"]) == ["0", "1", "2", "3"]
    assert render_json(diag, include_series=True) == text  # deterministic


def test_json_orders_series_by_rank_number():
    diag = Diagnosis(
        verdict="inconclusive",
        loss_shape=None,
        loss_series={10: [[0, 1.0]], 2: [[0, 1.0]]},
        findings=[Finding("X", "healthy", "info", 0.5, "t")],
    )
    assert list(json.loads(render_json(diag, include_series=True))["loss_series"]) == ["2", "10"]


def test_downsample_keeps_spikes_and_gaps():
    import numpy as np

    x = np.arange(10_000, dtype=float)
    y = np.ones(10_000)
    y[4321] = 50.0
    y[7000] = math.nan
    xs, ys = downsample(x, y, 2000)
    assert xs.size <= 2000
    assert 50.0 in ys and 4321.0 in xs
    assert np.isnan(ys).sum() == 1
    assert np.all(np.diff(xs) >= 0)


def test_big_html_report_stays_small():
    # Speed is measured in benchmarks/bench_doctor.py; this checks the downsampling.
    gc.disable()  # building 5M Python floats for the fixture is GC-bound, not our code
    try:
        diag = big_diagnosis(256, 10_000)
    finally:
        gc.enable()
    page = render_html(diag)
    size = len(page.encode("utf-8"))
    # Static SVG, two points per pixel column, PNG grids: no plotting bundle at all.
    assert size < 1_000_000, f"{size / 1e6:.2f} MB"
    assert "<script" not in page

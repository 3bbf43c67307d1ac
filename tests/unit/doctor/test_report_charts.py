"""The report's charts at the sizes people run: 5 steps, 150 steps (the lab's real
dropped-rank run), 100,000 steps × 256 ranks. Each chart is checked from the page
itself (the agreement grid and the gradient-norm grid decoded from their PNGs, the
line ends against the axis), then photographed in headless Chromium; the
screenshots go to $SYNCDOCTOR_SCREENSHOTS when set (to look at them), else to the
test's temporary folder."""

from __future__ import annotations

import base64
import os
import re
import shutil
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.model import Diagnosis
from syncdoctor.doctor.report import charts as ch
from syncdoctor.doctor.report import render_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "report"))
from browser import CHROMIUM, SKIP_REASON, screenshot  # noqa: E402
from runs import big_diagnosis, write_run  # noqa: E402

GREEN, RED, GREY, WHITE = ch.STATE_RGB[ch.AGREED], ch.STATE_RGB[ch.PARTED], ch.STATE_RGB[ch.MISSING], (255,) * 3


def _decode_png(uri: str) -> np.ndarray:
    """The report's own PNGs (8-bit RGB, filter 0 on every row) back to an array."""
    data = base64.b64decode(uri.split(",", 1)[1])
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + 3 * width)
    assert (raw[:, 0] == 0).all()
    return raw[:, 1:].reshape(height, width, 3)


def _charts(page: str) -> dict[str, str]:
    return {
        m.group(1): m.group(0) for m in re.finditer(r'<svg class="chart"[^>]*aria-label="([^"]+)".*?</svg>', page, re.S)
    }


def _grid(svg: str) -> np.ndarray:
    return _decode_png(re.search(r'href="(data:image/png;base64,[^"]+)"', svg).group(1))


def _colour_share(grid: np.ndarray, rgb: tuple[int, int, int]) -> float:
    return float((grid == np.array(rgb, np.uint8)).all(axis=2).mean())


def _last_x(svg: str) -> float:
    """The right-most point any line reaches, in SVG units."""
    xs = [
        float(x)
        for d in re.findall(r'<path class="line[^"]*"[^>]* d="([^"]+)"', svg)
        for x in re.findall(r"[ML](-?[\d.]+) ", d)
    ]
    return max(xs)


def _x_of(svg: str, step: float, lo: float, hi: float) -> float:
    pad = (hi - lo) * 0.015
    return ch.LEFT + (step - (lo - pad)) / ((hi + pad) - (lo - pad)) * ch.PLOT_W


def _shoot(page: str, name: str, tmp_path: Path, height: int = 3000) -> Path:
    html = tmp_path / f"{name}.html"
    html.write_text(page, encoding="utf-8")
    png = tmp_path / f"{name}.png"
    proc = screenshot(html, png, height=height)
    assert proc.returncode == 0 and png.stat().st_size > 20_000, proc.stderr[-2000:]
    assert [line for line in proc.stderr.splitlines() if ":CONSOLE" in line] == []  # no error, no CSP violation
    keep = os.environ.get("SYNCDOCTOR_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(keep) / png.name)
        shutil.copy(html, Path(keep) / html.name)
    return png


@pytest.fixture(scope="module")
def five_steps(tmp_path_factory) -> Diagnosis:
    return diagnose([write_run(tmp_path_factory.mktemp("five"), world=2, steps=5, check_every=1)])


def test_five_step_run_fills_every_chart(five_steps, tmp_path):
    page = render_html(five_steps)
    charts = _charts(page)
    assert set(charts) == {
        "replica agreement per check, rank by step",
        "loss per rank by step",
        "gradient norm per rank by step",
    }
    agreement = _grid(charts["replica agreement per check, rank by step"])
    assert agreement.shape[0] == 2  # one row per rank
    first = int(np.argmax((agreement != 255).any(axis=2).any(axis=0)))
    assert first <= 12 and _colour_share(agreement[:, first:], GREEN) == 1.0  # every check agreed
    loss = charts["loss per rank by step"]
    assert loss.count("<circle") == 10  # five points per rank, each drawn
    assert abs(_last_x(loss) - _x_of(loss, 5, 1, 5)) < 1
    assert ">5</text>" in loss  # the axis reaches the last step
    if CHROMIUM:
        _shoot(page, "report-5-steps", tmp_path, height=2000)


@pytest.mark.slow
def test_lab_dropped_rank_report_marks_the_left_out_rank(lab, tmp_path):
    result = lab("dropped-rank")
    diag = diagnose([result.out])
    assert diag.divergence_step == 50 and diag.last_agree_step == 40
    status = {r.rank: r.status for r in diag.ranks}
    assert status[1] == "left out of the average", status
    page = render_html(diag)
    row = re.search(r"<tr><td class=\"num\">1</td>.*?</tr>", page).group(0)
    assert "left out of the average" in row
    assert "Replicas parted <b>between step 41 and 50</b>" in page
    charts = _charts(page)
    agreement = _grid(charts["replica agreement per check, rank by step"])
    # Two ranks that disagree: no majority says which is right, so both rows turn red
    # at the first disagreeing check (the per-rank table names the left-out one).
    last = max(r.steps for r in diag.ranks)
    x1, x50 = (int(_x_of("", s, 1, last) - ch.LEFT) for s in (1, 50))
    assert (agreement[:, x50 + 1 :] == RED).all()
    assert "ranks 0, 1 disagree</span>: no majority of the 2 says which side is right" in page
    assert status[0] == "not averaged"
    assert (agreement[:, x1 + 1 : x50 - 1] == GREEN).all() and (agreement[:, : x1 - 1] == WHITE).all()
    loss = charts["loss per rank by step"]
    assert 'class="bracket"' in loss and "replicas parted between step 41 and 50" in loss
    assert abs(_last_x(loss) - (ch.WIDTH - ch.RIGHT - ch.PLOT_W * 0.015 / 1.03)) < 2
    grad = charts["gradient norm per rank by step"]
    assert grad.count("<circle") == 4  # steps 1 and 100 on each rank: its own norm, not the reduced one
    norms = {r: [v for _, v in s] for r, s in diag.grad_norm_series.items()}
    assert norms[0] != norms[1]
    # The probe's own mismatch lines are in the events table, with the step they name
    # (and when they were logged), kind unbroken; the chart marks only the comm event.
    assert re.search(
        r'<td class="nowrap">mismatch</td><td class="num">\d</td>'
        r'<td class="nowrap">50 <span class="detail">\(logged at \d+\)</span></td>',
        page,
    )
    assert loss.count('class="evt"') == 1 and "timeout" in re.search(r'class="evt".*?</path>', loss).group(0)
    if CHROMIUM:
        _shoot(page, "report-150-steps-dropped-rank", tmp_path)


def test_100k_steps_by_256_ranks(tmp_path):
    diag = big_diagnosis(256, 100_000)
    page = render_html(diag)
    assert len(page.encode()) < 1_000_000
    charts = _charts(page)
    agreement = _grid(charts["replica agreement per check, rank by step"])
    assert agreement.shape[:2] == (256, ch.PLOT_W)
    assert _colour_share(agreement, WHITE) < 0.016  # checks from step 1 to the end (the margin left of it)
    parted_from = int(np.argmax((agreement[7] == RED).all(axis=1)))
    assert abs(parted_from - (_x_of("", 41_250, 1, 100_000) - ch.LEFT)) <= 1
    x1 = int(_x_of("", 1, 1, 100_000) - ch.LEFT)
    assert _colour_share(np.delete(agreement, 7, axis=0)[:, x1 + 1 :], GREEN) == 1.0
    grad = _grid(charts["gradient norm, rank by step"])
    assert grad.shape[:2] == (256, ch.PLOT_W)
    x100, xend = (int(_x_of("", s, 1, 100_000) - ch.LEFT) for s in (100, 100_000))
    assert _colour_share(grad[:, x100 + 1 : xend], WHITE) == 0.0  # every rank's norms fill the run
    # Rank 7's norm is three times the others' after the onset: the brightest row.
    brightness = grad[:, -100:].astype(int).sum(axis=2).mean(axis=1)
    assert int(np.argmax(brightness)) == 7
    loss = charts["loss per rank by step"]
    assert 'class="band"' in loss and 'class="median"' in loss and "rank 7" in loss
    assert ">100,000</text>" in loss
    assert loss.count('class="line') == 1  # only the rank singled out, over the envelope
    assert loss.count('class="evt"') == 1  # the timeout; the probe's own mismatch line is not drawn
    if CHROMIUM:
        _shoot(page, "report-100k-steps-256-ranks", tmp_path)


def test_1024_ranks_bin_rows_and_one_rank_needs_no_comparison():
    diag = big_diagnosis(1024, 2_000, series_points=200)
    charts = _charts(render_html(diag))
    assert _grid(charts["replica agreement per check, rank by step"]).shape[0] == 256  # 4 ranks a row
    assert _grid(charts["gradient norm, rank by step"]).shape[0] == 256
    single = big_diagnosis(1, 300, series_points=50)
    single.agreement, single.divergence_step, single.last_agree_step = [], None, None
    page = render_html(single)
    assert "one rank: nothing to compare it with" in page
    assert len(_charts(page)) == 2


def test_diagnosis_renders_itself_in_jupyter(five_steps):
    fragment = five_steps._repr_html_()
    assert fragment.startswith('<div class="sdr"><style>') and fragment.endswith("</div>")
    assert "<html" not in fragment and "<script" not in fragment
    assert fragment.count('<svg class="chart"') == 3


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_screenshots_need_chromium():
    """Marks, in the test report, that the screenshots above were taken."""

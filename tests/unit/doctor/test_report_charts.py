"""The report's charts at the sizes people run: 5 steps, 150 steps (the lab's real
dropped-rank run: tests/e2e/lab/test_report_lab.py), 100,000 steps × 256 ranks. Each chart is checked from the page
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "report"))
from browser import CHROMIUM, SKIP_REASON, screenshot  # noqa: E402
from report_runs import big_diagnosis, write_run  # noqa: E402

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

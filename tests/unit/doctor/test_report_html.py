"""The HTML report: escaping checked statically, then for real in headless Chromium.

The report holds no script at all (its charts are static SVG drawn in Python), and
its Content-Security-Policy forbids every script, so a payload that slipped through
escaping still could not run. CI installs Chromium (scripts/setup.sh --test); without
it the browser test is skipped (with the reason), the static checks still run. The
browser helpers are shared with tests/unit/reliability/test_hostile_e2e.py
(tests/fixtures/report/browser.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from syncdoctor.doctor.report import render_html

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "report"))
from browser import CHROMIUM, SKIP_REASON, dump_dom, hostile_traces  # noqa: E402
from hostile import HOSTILE_TEXTS, TOP_TITLE, hostile_diagnosis  # noqa: E402


@pytest.fixture(scope="module")
def page() -> str:
    return render_html(hostile_diagnosis())


def test_static_page_has_no_raw_hostile_markup(page):
    body = page.split("</head>", 1)[1]
    assert not re.search(r"<script\b", page, re.I)  # no script anywhere, ours included
    assert "<img" not in body.lower()
    assert 'onerror="' not in body
    assert "\x1b" not in page
    assert "&lt;script&gt;window.__pwned=1" in body  # shown, as text
    assert TOP_TITLE in body
    for h in HOSTILE_TEXTS:
        if "<" in h:
            assert h not in body


def test_charts_survive_awkward_numbers(page):
    # NaN/inf become gaps, 1e308 is clipped, the loss axis turns logarithmic.
    svgs = re.findall(r'<svg class="chart".*?</svg>', page, re.S)
    assert len(svgs) == 2  # loss, grad norm (no records: the agreement is a note)
    assert "the replicas were not compared" in page
    loss = next(s for s in svgs if "loss per rank" in s)
    assert "loss (log)" in loss
    assert "nan" not in loss.lower().replace("<title>", "")
    assert loss.count('class="line"') == 4
    assert "replicas parted at or before step 25" in loss


def test_csp_forbids_every_script(page):
    m = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert m
    csp = m.group(1).replace("&#x27;", "'")
    assert "default-src 'none'" in csp
    assert "script-src" not in csp  # falls back to default-src 'none': no script at all
    assert "unsafe-eval" not in csp and "http" not in csp


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_report_renders_in_headless_chromium_without_running_hostile_code(page, tmp_path):
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    proc = dump_dom(report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    assert dom.count('<svg class="chart"') == 2
    assert 'id="sd-agreement-none"' in dom
    # No hostile payload ran (a title change, data-pwned, an <img>), and the page
    # logged nothing to the console: no errors, no CSP violations.
    assert hostile_traces(proc) == []

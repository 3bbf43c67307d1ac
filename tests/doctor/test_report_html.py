"""The HTML report: escaping checked statically, then for real in headless Chromium.

CI runs scripts/install_chromium.sh first; without Chromium the browser test is
skipped (with the reason), the static checks still run. The browser helpers are
shared with tests/reliability/test_hostile_e2e.py (tests/fixtures/report/browser.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from syncdoctor.doctor.report import render_html

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "report"))
from browser import CHROMIUM, SKIP_REASON, dump_dom, hostile_traces  # noqa: E402
from hostile import HOSTILE_TEXTS, TOP_TITLE, hostile_diagnosis  # noqa: E402


@pytest.fixture(scope="module")
def page() -> str:
    return render_html(hostile_diagnosis())


def _json_block(html: str) -> str:
    m = re.search(r'<script type="application/json" id="sd-data">(.*?)</script>', html, re.S)
    assert m, "chart data block missing"
    return m.group(1)


def test_static_page_has_no_raw_hostile_markup(page):
    body = page.split("</head>", 1)[1]
    # Only our two scripts (data block + app) exist in the body.
    assert len(re.findall(r"<script\b", body, re.I)) == 2
    body = body.replace(_json_block(page), "")  # checked on its own below
    assert "<img" not in body.lower()
    assert 'onerror="' not in body
    assert "\x1b" not in page
    assert "&lt;script&gt;window.__pwned=1" in body  # shown, as text
    assert TOP_TITLE in body
    for h in HOSTILE_TEXTS:
        if "<" in h:
            assert h not in body


def test_chart_data_block_cannot_break_out(page):
    block = _json_block(page)
    assert "<" not in block and ">" not in block and "&" not in block
    data = json.loads(block)
    assert [s["r"] for s in data["loss"]] == [0, 1, 2, 3]
    rank1 = data["loss"][1]
    assert rank1["y"][30] is None and rank1["y"][31] is None  # nan, inf → gaps
    assert data["loss"][2]["y"][20] == 1e300  # 1e308 clipped so plotly's axis maths stays finite
    assert data["logy"] is True
    assert data["div"] == 25
    assert len(data["events"]) == 2  # non-benign events with a step
    assert data["heat"]["ranks"] == [0, 1, 2, 3]


def test_csp_allows_only_our_scripts(page):
    m = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert m
    csp = m.group(1).replace("&#x27;", "'")
    assert "default-src 'none'" in csp
    assert "unsafe-eval" not in csp and "http" not in csp
    script_src = re.search(r"script-src ([^;]+);", csp).group(1).split()
    assert len(script_src) == 2 and all(s.startswith("'sha256-") for s in script_src)


@pytest.mark.skipif(CHROMIUM is None, reason=SKIP_REASON)
def test_report_renders_in_headless_chromium_without_running_hostile_code(page, tmp_path):
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    proc = dump_dom(report)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    # The charts drew: plotly built its SVGs and our script marked success.
    assert 'data-charts="drawn"' in dom, re.findall(r'id="sd-chart-status"[^<]*<', dom)
    assert dom.count('class="main-svg"') >= 2
    assert 'id="sd-loss"' in dom and 'id="sd-heat"' in dom
    # No hostile payload ran (a title change, data-pwned, an <img>), and the page
    # logged nothing to the console: no errors, no CSP violations.
    assert hostile_traces(proc) == []

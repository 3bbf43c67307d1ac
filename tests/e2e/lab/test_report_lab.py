"""The report's charts on the lab's real dropped-rank run (150 steps): the charts of
every other size are in tests/unit/doctor/test_report_charts.py, whose page decoders
this uses."""

from __future__ import annotations

import re

from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.doctor.report import charts as ch
from syncdoctor.doctor.report import render_html
from tests.unit.doctor.test_report_charts import CHROMIUM, GREEN, RED, WHITE, _charts, _grid, _last_x, _shoot, _x_of

LAB_RUNS = [{"fault": "dropped-rank"}]  # started ahead (tests/conftest.py)


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

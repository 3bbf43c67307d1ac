"""The experiment's table in the terminal and its section in the doctor's HTML style."""

from __future__ import annotations

from html import escape

import numpy as np

from syncdoctor.doctor.report import charts as ch
from syncdoctor.doctor.report import html as doctor_html
from syncdoctor.doctor.series import downsample
from syncdoctor.experiment.compare import Comparison, Measures

HEADERS = ("run", "applied", "replicas agree", "loss offsets", "curve", "blow-up", "top cause", "anomaly gone")
SHORT_HEADERS = ("run", "applied", "agree", "offsets", "curve", "blow-up", "cause", "gone")


def _applied(m: Measures) -> str:
    if m.name == "control":
        return "-"
    if not m.ran:
        return f"no: {m.how}"
    if m.error:
        return f"no result: {m.error}"
    if m.applied is None:
        return f"yes: {m.how or 'one process'}" if m.name == "single" else "not reported"
    return ("yes" if m.applied else "no") + (f": {m.how}" if m.how else "")


def row(m: Measures, comparison: Comparison) -> list[str]:
    if not m.ran or m.error:
        return [m.name, _applied(m), "", "", "", "", "", ""]
    if m.replicas_agree is None:
        agree = "one rank" if m.world_size == 1 else "no check"
    elif m.replicas_agree:
        agree = "yes"
    else:
        agree = f"no, from step {m.first_mismatch_step}" + (
            f" ({', '.join(m.mismatch_what)})" if m.mismatch_what else ""
        )
    offsets = ", ".join(f"rank {r}: {v:+.1%}" for r, v in m.offsets.items()) or "none"
    cause = f"{m.top_code} {m.top_title}" if m.top_code else (m.verdict or "")
    gone = ", ".join(comparison.removed.get(m.name, [])) if m.name != "control" else ""
    if m.name != "control" and m.name not in comparison.removed:
        gone = "(not compared)"
    return [m.name, _applied(m), agree, offsets, m.shape or "", "yes" if m.blowup else "no", cause, gone or "-"]


_TERSE_ANOMALY = {"replica_mismatch": "replicas", "loss_offset": "offsets", "shape": "shape", "blowup": "blow-up"}


def _terse(cells: list[str], m: Measures, comparison: Comparison) -> list[str]:
    """A terminal is narrow: yes/no for applied (what each variant changed follows the
    table), "no @step" for the replicas, the top cause's code, the removed anomalies'
    short names; a single rank is credited only with what one rank can show."""
    cells = list(cells)
    cells[1] = cells[1].split(":", 1)[0]
    cells[2] = cells[2].replace(", from step ", " @").split(" (")[0]
    cells[6] = m.top_code or cells[6]
    if m.name != "control" and m.name in comparison.removed:
        gone = comparison.removed[m.name]
        if m.name == "single":
            gone = [k for k in gone if k in ("shape", "blowup")]
        cells[7] = ", ".join(_TERSE_ANOMALY.get(k, k.removeprefix("cause:")) for k in gone) or "-"
    return cells


def print_table(comparison: Comparison, console: object) -> None:
    from rich.table import Table

    table = Table(title="syncdoctor experiment: each variant against the control", show_lines=False)
    for h in SHORT_HEADERS:
        table.add_column(h, overflow="fold")
    runs = [comparison.control, *comparison.variants]
    for m in runs:
        table.add_row(*_terse(row(m, comparison), m, comparison))
    console.print(table)  # type: ignore[attr-defined]
    for m in comparison.variants:
        console.print(f"  {m.name}: {_applied(m)}", markup=False, highlight=False)  # type: ignore[attr-defined]
    for line in comparison.verdict:
        console.print(f"• {line}", markup=False, highlight=False)  # type: ignore[attr-defined]


def _overlay(runs: list[Measures]) -> str:
    """The mean loss over ranks per step, one line per run (the control first)."""
    curves = {m.name: np.asarray(m.loss_curve, float).reshape(-1, 2) for m in runs if m.loss_curve}
    if not curves:
        return "<p>No run recorded a loss.</p>"
    xs = ch.Scale(*ch.step_domain([c[:, 0] for c in curves.values()]), ch.LEFT, ch.WIDTH - ch.RIGHT)
    top, bottom = ch.TOP + 8, ch.HEIGHT - ch.BOTTOM
    ys = ch.value_scale([c[:, 1] for c in curves.values()], bottom, top)
    parts = [ch.svg_open(ch.HEIGHT, "mean loss per run by step"), ch.y_axis(ys, "mean loss over ranks")]
    legend = []
    for i, (name, c) in enumerate(curves.items()):
        colour = ch.PALETTE[i % len(ch.PALETTE)]
        x, y = downsample(c[:, 0], ch.finite_clipped(c[:, 1]), 2 * ch.PLOT_W)
        parts.append(
            f'<path class="line" stroke="{colour}" d="{ch.polyline_path(xs.px(x), ys.px(y))}">'
            f"<title>{escape(name)}</title></path>"
        )
        legend.append(("line", colour, name))
    parts += [ch.x_axis(xs, bottom), "</svg>"]
    return "<h3>Mean loss over ranks, each run</h3>" + "".join(parts) + doctor_html.legend_html(legend)


def render_section(comparison: Comparison, command: list[str]) -> str:
    runs = [comparison.control, *comparison.variants]
    table = doctor_html.table_html(
        list(HEADERS), [[doctor_html.escape_text(cell) for cell in row(m, comparison)] for m in runs], caption=""
    )
    verdict = "".join(f"<li>{doctor_html.escape_text(line)}</li>" for line in comparison.verdict)
    folders = "".join(f"<li>{doctor_html.escape_text(m.name)}: {doctor_html.escape_text(m.folder)}</li>" for m in runs)
    return (
        '<section id="experiment"><h2>Experiment: which variant removes the anomaly</h2>'
        f'<p class="meta">{doctor_html.escape_text(" ".join(command), limit=2000)}</p>'
        f"<ul>{verdict}</ul>{table}{_overlay(runs)}"
        f"<h3>Run folders (each diagnoses on its own)</h3><ul>{folders}</ul></section>"
    )


def render_page(comparison: Comparison, command: list[str]) -> str:
    title = "syncdoctor experiment"
    body = f"<header><h1>{title}</h1></header>\n{render_section(comparison, command)}"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(doctor_html.CSP)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        f"<title>{title}</title>\n</head><body>\n"
        f'<div class="sdr"><style>{doctor_html.CSS}</style>\n{body}\n</div>\n</body></html>\n'
    )

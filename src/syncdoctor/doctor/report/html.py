"""The diagnosis as one self-contained HTML file that works offline.

Safety model: the page shows text taken from logs written by whatever ran on the
cluster, so every such string is cleaned (:func:`clean`) and HTML-escaped where it
is inserted. The charts are static SVG drawn here (charts.py), so the page holds no
script at all, and its Content-Security-Policy forbids every script, every network
access and every plugin: even an escaping bug could not run code or phone home.

Size: no plotting bundle; lines are reduced to two points per pixel column, rank ×
step grids are small PNGs, so a 256-rank × 100,000-step run is a few hundred kB.

:func:`render_fragment` is the same report without the page around it (Jupyter's
display hook, report/jupyter.py).
"""

from __future__ import annotations

import math
import re
from html import escape
from itertools import chain

import numpy as np

from syncdoctor.doctor.model import (
    BASELINE_VERDICT_TEXT,
    DIAGNOSIS_SCHEMA,
    VERDICT_TEXT,
    AgreementSpan,
    BaselineComparison,
    Diagnosis,
    Event,
    Finding,
    LossShape,
    confidence_text,
)
from syncdoctor.doctor.report import charts as ch
from syncdoctor.doctor.report.common import (
    MAX_RANK_ROWS,
    bracket_text,
    clean,
    envelope,
    fmt_num,
    needs_attention,
    shape_line,
    shapes_by_rank,
    summarize_events,
)
from syncdoctor.doctor.series import downsample
from syncdoctor.records import stages
from syncdoctor.rulebook import SEVERITIES, fmt_ranks

# The public API: the two renderers, and the pieces another HTML page built on this
# report's style uses (experiment/report.py): the stylesheet, escaping untrusted
# text, a legend and a table.
__all__ = ["CSS", "CSP", "escape_text", "legend_html", "render_fragment", "render_html", "table_html"]

_MAX_EVENT_MARKERS = 2000
_MAX_EVENT_ROWS = 200
_MAX_SPAN_ROWS = 40
# Events drawn on the step axis: communication and process trouble. The probe's own
# mismatch lines ("syncdoctor: ... mismatch at step 50") are the timeline's business.
_MARKED_KINDS = {
    "timeout",
    "retry",
    "watchdog",
    "network",
    "crash",
    "oom",
    "exception",
    "signal",
    "exit",
    "configuration",
}
_STEP_IN_TEXT = re.compile(r"\bat step (\d{1,12})\b")

_SHAPE_CLASS = {
    "decreasing": "ok",
    "noise": "ok",
    "flat": "warn",
    "plateau_chance": "warn",
    "spike": "warn",
    "diverging": "bad",
    "sawtooth": "bad",
    "nonfinite": "bad",
    "too_short": "info",
}
_VERDICT_CLASS = {
    "healthy": "ok",
    "sync_problem": "bad",
    "not_sync_problem": "warn",
    "inconclusive": "info",
}
_STATUS_CLASS = {
    "ok": "ok",
    "ended early": "warn",
    "missing": "warn",
    "stalled": "warn",
    "not averaged": "warn",
    "disagrees": "warn",
}
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"


def render_html(diag: Diagnosis, title: str = "syncdoctor report") -> str:
    """Return the complete HTML page for ``diag``."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(CSP)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(clean(title, oneline=True))}</title>\n"
        "</head><body>\n"
        f"{render_fragment(diag, title)}\n"
        "</body></html>\n"
    )


def render_fragment(diag: Diagnosis, title: str = "syncdoctor report") -> str:
    """The report as one <div> with its own (scoped) style: for pages and notebooks."""
    body = "\n".join(
        [
            _header(diag, title),
            _list_section("What was checked", diag.coverage, "coverage"),
            _shape_section(diag),
            _baseline_section(diag),
            _findings_section(diag.findings),
            _charts_section(diag),
            _ranks_section(diag),
            _events_section(diag.events),
            _list_section("Run", [f"{k}: {v}" for k, v in diag.run.items()], "run"),
            _list_section("Input warnings", diag.warnings, "warnings"),
            _list_section("Sources", diag.sources, "sources"),
        ]
    )
    return f'<div class="sdr"><style>{CSS}</style>\n{body}\n</div>'


# --- text sections -----------------------------------------------------------------------------


def escape_text(text: object, limit: int | None = None, oneline: bool = False) -> str:
    """Untrusted text → inert HTML text."""
    return escape(clean(text, oneline=oneline, limit=limit), quote=True)


def _header(diag: Diagnosis, title: str) -> str:
    cls = _VERDICT_CLASS.get(diag.verdict, "info")
    verdict = VERDICT_TEXT.get(diag.verdict, str(diag.verdict))
    div = ""
    if diag.divergence_step is not None:
        last = (
            f"the last check where all ranks agreed: step {escape_text(diag.last_agree_step)}; "
            if diag.last_agree_step is not None
            else ""
        )
        div = (
            f"<p>Replicas parted <b>{escape_text(bracket_text(diag))}</b> "
            f'<span class="detail">({last}the first where they differed: step '
            f"{escape_text(diag.divergence_step)})</span>.</p>"
        )
    facts = []
    if diag.world_size:
        facts.append(f"{diag.world_size} rank{'s' if diag.world_size != 1 else ''}")
    steps = [r.steps for r in diag.ranks if r.steps is not None]
    if steps:
        facts.append(f"{max(steps):,} steps")
    checks = sum(s.checks for s in diag.agreement)
    if checks:
        facts.append(f"{checks:,} replica checks")
    return (
        f"<header><h1>{escape_text(title, oneline=True)}</h1>"
        f'<p class="verdict {cls}">{escape_text(verdict)}</p>{div}'
        f'<p class="meta">{escape_text(" · ".join([*facts, DIAGNOSIS_SCHEMA]))}</p></header>'
    )


def _shape_html(shape: LossShape) -> str:
    cls = _SHAPE_CLASS.get(shape.shape, "info")
    nums = " · ".join(
        f"{name} {fmt_num(v)}"
        for name, v in (
            ("amplitude", shape.amplitude),
            ("rhythm", shape.rhythm),
            ("trend", shape.trend),
        )
        if v is not None
    )
    return (
        f'<p><span class="tag {cls}">{escape_text(shape.shape)}</span> {escape_text(shape_line(shape))}'
        f'{f" · {escape_text(nums)}" if nums else ""}</p><p class="detail">{escape_text(shape.detail)}</p>'
    )


def _shape_section(diag: Diagnosis) -> str:
    if diag.loss_shape is None:
        return ""
    return f'<section id="shape"><h2>Loss shape</h2>{_shape_html(diag.loss_shape)}</section>'


def _finding_html(f: Finding, top: bool) -> str:
    facts = [
        ("code", f.code),
        ("category", f.category),
        ("severity", f.severity),
        ("confidence", confidence_text(f, fmt_num(f.confidence * 100, 3))),
        ("step", f.step),
        ("ranks", fmt_ranks(f.ranks) if f.ranks else None),
        ("stage", stages.name(f.stage)),
        ("tensor", f.tensor),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{escape_text(v, limit=300)}</dd>" for k, v in facts if v is not None)
    evidence = "".join(f"<li>{escape_text(x, limit=2000)}</li>" for x in f.evidence)
    sev = f.severity if f.severity in SEVERITIES else "info"
    return (
        f'<article class="finding {sev}{" top" if top else ""}">'
        f"<h3>{escape_text(f.title, oneline=True)}</h3><dl>{dl}</dl>"
        f"{f'<h4>Evidence</h4><ul>{evidence}</ul>' if evidence else ''}"
        f"{f'<h4>Fix</h4><p class=fix>{escape_text(f.fix)}</p>' if f.fix else ''}</article>"
    )


def _findings_section(findings: list[Finding]) -> str:
    if not findings:
        return '<section id="findings"><h2>Findings</h2><p>No findings.</p></section>'
    cards = "".join(_finding_html(f, i == 0) for i, f in enumerate(findings))
    return f'<section id="findings"><h2>Findings</h2>{cards}</section>'


def table_html(headers: list[str], rows: list[list[str]], caption: str = "", cls: list[str] | None = None) -> str:
    """A table of cells that are HTML already (escape untrusted text with :func:`escape_text`
    first); `cls`: a CSS class per column."""
    classes = cls or [""] * len(headers)
    head = "".join(f'<th class="{c}">{h}</th>' if c else f"<th>{h}</th>" for h, c in zip(headers, classes, strict=True))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{c}">{v}</td>' if c else f"<td>{v}</td>" for v, c in zip(row, classes, strict=True))
        + "</tr>"
        for row in rows
    )
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ranks_section(diag: Diagnosis) -> str:
    if not diag.ranks:
        return ""
    shapes = shapes_by_rank(diag)
    rows = []
    listed, caption = diag.ranks, ""
    if len(listed) > MAX_RANK_ROWS:
        # hundreds of ranks: the ones that stand out, and one line for the rest
        ordinary = [r for r in listed if not needs_attention(r, shapes)]
        listed = [r for r in listed if needs_attention(r, shapes)]
        if ordinary:
            caption = escape_text(
                f"{len(ordinary)} more rank(s) look ordinary and are not listed"
                + (f": {envelope(ordinary)}" if envelope(ordinary) else "")
            )
    for r in listed:
        shape = shapes.get(r.rank)
        shape_cell = (
            f'<span class="tag {_SHAPE_CLASS.get(shape.shape, "info")}" title="{escape_text(shape.detail)}">'
            f"{escape_text(shape.shape)}</span>"
            if shape
            else ""
        )
        status_cls = _STATUS_CLASS.get(r.status, "bad") if r.status else ""
        rows.append(
            [
                escape_text(r.rank),
                escape_text(fmt_num(r.steps)),
                escape_text(fmt_num(r.last_loss)),
                escape_text(fmt_num(r.mean_loss)),
                escape_text(fmt_num(r.grad_norm)),
                shape_cell,
                f'<span class="st {status_cls}">{escape_text(r.status, limit=40)}</span>',
                escape_text(r.note, limit=500),
            ]
        )
    norm = {"local": "grad norm (own, median)", "reduced": "grad norm (reduced, median)"}.get(
        diag.grad_norm_kind, "grad norm"
    )
    headers = ["rank", "steps", "last loss", "mean loss", norm, "shape", "status", "note"]
    cls = ["num", "num", "num", "num", "num", "nowrap", "nowrap", ""]
    return f'<section id="ranks"><h2>Per rank</h2>{table_html(headers, rows, caption=caption, cls=cls)}</section>'


def _named_step(e: Event) -> int | None:
    """The step a line talks about ("... mismatch at step 50"), when it names one."""
    m = _STEP_IN_TEXT.search(clean(e.raw))
    return int(m.group(1)) if m else None


def _event_row(e: Event) -> list[str]:
    src = clean(e.source, oneline=True, limit=200) + (f":{e.line}" if e.line is not None else "")
    named = _named_step(e)
    if named is not None and named != e.step:
        step = f"{named}" + (
            f' <span class="detail">(logged at {escape_text(e.step)})</span>' if e.step is not None else ""
        )
    else:
        step = escape_text(fmt_num(e.step))
    return [
        escape_text(e.kind, limit=40),
        escape_text(fmt_num(e.rank)),
        step,
        escape_text(e.host, limit=80) if e.host else "",
        f"<code>{escape_text(e.raw, limit=1000)}</code>",
        escape(src),
    ]


def _events_section(events: list[Event]) -> str:
    if not events:
        return ""
    summary = summarize_events(events, limit=_MAX_EVENT_ROWS)
    counts = ", ".join(
        f"{escape_text(kind, limit=40)} {total}" + (f" ({benign} benign)" if benign else "")
        for kind, total, benign in summary.counts
    )
    more = summary.notable_total - len(summary.notable)
    caption = f"first {len(summary.notable)} of {summary.notable_total} non-benign events" + (
        f"; {more} more in the JSON output" if more else ""
    )
    table = (
        table_html(
            ["kind", "rank", "step", "host", "line", "source"],
            [_event_row(e) for e in summary.notable],
            caption,
            cls=["nowrap", "num", "nowrap", "nowrap", "", ""],
        )
        if summary.notable
        else "<p>All events are known-benign.</p>"
    )
    return f'<section id="events"><h2>Events</h2><p>{counts}</p>{table}</section>'


def _list_section(heading: str, items: list[str], anchor: str) -> str:
    if not items:
        return ""
    lis = "".join(f"<li>{escape_text(x, limit=2000)}</li>" for x in items)
    return f'<section id="{anchor}"><h2>{escape(heading)}</h2><ul>{lis}</ul></section>'


def _baseline_section(diag: Diagnosis) -> str:
    """`diagnose --baseline`: the verdict, its evidence, both mean curves on one plot
    with the parting step marked."""
    cmp = diag.baseline
    if cmp is None:
        return ""
    cls = {"agree": "ok", "better": "ok", "parallel_part": "bad", "not_parallel_part": "warn"}.get(cmp.verdict, "info")
    items = "".join(f"<li>{escape_text(line, limit=600)}</li>" for line in cmp.evidence)
    return (
        '<section id="baseline"><h2>Against the baseline</h2>'
        f'<p><span class="tag {cls}" id="sd-baseline-verdict">{escape_text(BASELINE_VERDICT_TEXT.get(cmp.verdict, cmp.verdict))}</span> '
        f"baseline: <code>{escape_text(cmp.path, limit=300, oneline=True)}</code></p>"
        f"<ul>{items}</ul>{_baseline_chart(cmp)}</section>"
    )


def _baseline_chart(cmp: BaselineComparison) -> str:
    curves = {}
    for key in ("run", "baseline"):
        try:
            steps, values = _as_arrays(cmp.series.get(key) or [])
        except (TypeError, ValueError):
            continue
        if steps.size:
            curves[key] = (steps, values)
    if not curves:
        return ""
    domain = ch.step_domain([s for s, _ in curves.values()], [cmp.parted_at_step])
    xs = ch.Scale(domain[0], domain[1], ch.LEFT, ch.WIDTH - ch.RIGHT)
    top, bottom = ch.TOP + 8, ch.HEIGHT - ch.BOTTOM
    ys = ch.value_scale([v for _, v in curves.values()], bottom, top)
    parts = [
        ch.svg_open(ch.HEIGHT, "loss of this run and of the baseline"),
        ch.y_axis(ys, "loss" + (" (log)" if ys.log else "")),
    ]
    colours = {"run": ch.PALETTE[3], "baseline": ch.PALETTE[0]}
    names = {"run": "this run (mean over ranks)", "baseline": "baseline (mean over ranks)"}
    for key, (steps, values) in curves.items():
        x, y = downsample(steps, ch.finite_clipped(values), 2 * ch.PLOT_W)
        parts.append(
            f'<path class="line" id="sd-baseline-{key}" stroke="{colours[key]}" '
            f'd="{ch.polyline_path(xs.px(x), ys.px(y))}"><title>{names[key]}</title></path>'
        )
    if cmp.parted_at_step is not None:
        x1 = float(xs.px(cmp.parted_at_step))
        anchor = "end" if x1 > ch.LEFT + ch.PLOT_W * 0.6 else "start"
        dx = -4 if anchor == "end" else 4
        parts.append(
            f'<line class="div" id="sd-baseline-parting" x1="{ch.coord(x1)}" y1="{ch.coord(top)}" x2="{ch.coord(x1)}" '
            f'y2="{ch.coord(bottom)}"/><text class="divl" x="{ch.coord(x1 + dx)}" y="{ch.coord(top - 6)}" '
            f'text-anchor="{anchor}">curves part at step {cmp.parted_at_step}</text>'
        )
    parts.append(
        ch.x_axis(
            xs, bottom, "step of this run" + (" (baseline by samples seen)" if cmp.aligned_by == "samples" else "")
        )
    )
    parts.append("</svg>")
    legend = [("line", colours[k], names[k]) for k in curves]
    if cmp.parted_at_step is not None:
        legend.append(("mark", "#c62828", "where the curves part"))
    return "<h3>Loss: this run and the baseline</h3>" + "".join(parts) + legend_html(legend)


# --- charts ------------------------------------------------------------------------------------


def _as_arrays(pairs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """[[step, value], ...] → (steps, values) sorted by step, rows without a step dropped."""
    try:
        arr = np.fromiter(chain.from_iterable(pairs), float, count=2 * len(pairs)).reshape(-1, 2)
    except (TypeError, ValueError):  # ragged or odd rows: let numpy say what is wrong
        arr = np.asarray(pairs, dtype=float).reshape(-1, 2)
    arr = arr[np.isfinite(arr[:, 0])]
    order = np.argsort(arr[:, 0], kind="stable")
    return arr[order, 0], arr[order, 1]


def _series_arrays(series: dict[int, list[list[float]]]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for rank in sorted(series):
        try:
            steps, values = _as_arrays(series[rank])
        except (TypeError, ValueError):
            continue
        if steps.size:
            out[int(rank)] = (steps, values)
    return out


def _highlighted(diag: Diagnosis) -> list[int]:
    """Ranks the evidence singles out, for drawing on top of an envelope."""
    marked = [r.rank for r in diag.ranks if r.status not in ("ok", "", "missing")]
    for f in diag.findings:
        marked += f.ranks
    seen: list[int] = []
    for r in marked:
        if r not in seen:
            seen.append(r)
    return seen[: ch.MAX_HIGHLIGHT]


def _charts_section(diag: Diagnosis) -> str:
    loss = _series_arrays(diag.loss_series)
    grad = _series_arrays(diag.grad_norm_series)
    span_steps = [s for a in diag.agreement for s in (a.first_step, a.last_step)]
    domain = ch.step_domain(
        [s for s, _ in chain(loss.values(), grad.values())], [*span_steps, diag.divergence_step, diag.last_agree_step]
    )
    xs = ch.Scale(domain[0], domain[1], ch.LEFT, ch.WIDTH - ch.RIGHT)
    parts = ['<section id="charts"><h2>Charts</h2>']
    parts.append(_agreement_chart(diag, xs))
    if loss:
        parts.append(_loss_chart(diag, loss, xs))
    if grad:
        parts.append(_grad_chart(diag, grad, xs))
    if not loss and not grad:
        parts.append("<p>No loss or gradient-norm series to plot.</p>")
    parts.append("</section>")
    return "".join(parts)


def legend_html(items: list[tuple[str, str, str]]) -> str:
    """(kind, colour, text) → a one-line HTML legend; kind: line | band | mark."""
    out = []
    for kind, colour, text in items:
        out.append(f'<span class="lg"><i class="{kind}" style="background:{colour}"></i>{escape_text(text)}</span>')
    return f'<p class="legend">{"".join(out)}</p>'


def _bracket_svg(diag: Diagnosis, xs: ch.Scale, top: float, bottom: float) -> str:
    div = diag.divergence_step
    if div is None:
        return ""
    x1 = float(xs.px(div))
    parts = []
    if diag.last_agree_step is not None:
        x0 = float(xs.px(diag.last_agree_step))
        parts.append(
            f'<rect class="bracket" x="{ch.coord(x0)}" y="{ch.coord(top)}" width="{ch.coord(max(x1 - x0, 2))}" '
            f'height="{ch.coord(bottom - top)}"><title>replicas parted {escape(bracket_text(diag))}</title></rect>'
        )
    parts.append(
        f'<line class="div" x1="{ch.coord(x1)}" y1="{ch.coord(top)}" x2="{ch.coord(x1)}" y2="{ch.coord(bottom)}"/>'
    )
    anchor = "end" if x1 > ch.LEFT + ch.PLOT_W * 0.6 else "start"
    dx = -4 if anchor == "end" else 4
    parts.append(
        f'<text class="divl" x="{ch.coord(x1 + dx)}" y="{ch.coord(top - 6)}" text-anchor="{anchor}">'
        f"replicas parted {escape(bracket_text(diag))}</text>"
    )
    return "".join(parts)


def _agreement_chart(diag: Diagnosis, xs: ch.Scale) -> str:
    title = "<h3>Replica agreement: each check of the parameters across ranks</h3>"
    spans = diag.agreement
    if not spans:
        why = (
            "one rank: nothing to compare it with"
            if (diag.world_size or 0) == 1
            else "no probe records with parameter fingerprints: the replicas were not compared "
            "(run the job under <code>syncdoctor run</code> to get this)"
        )
        return f'{title}<p class="detail" id="sd-agreement-none">{why}.</p>'
    ranks = [r.rank for r in diag.ranks] or list(range(diag.world_size or 1))
    index = {r: i for i, r in enumerate(ranks)}
    per_row = ch.rank_bins(len(ranks))
    rows = math.ceil(len(ranks) / per_row)
    row_h = max(2.0, min(18.0, 220.0 / rows))
    top = ch.TOP
    grid_h = rows * row_h
    height = int(top + grid_h + ch.BOTTOM)
    grid = np.zeros((rows, ch.PLOT_W), np.uint8)
    starts = [s.first_step for s in spans]
    end_col = ch.PLOT_W  # the last check's outcome is the last known one
    for i, span in enumerate(spans):
        c0 = int(ch.columns_of(xs, np.array([span.first_step]))[0])
        c1 = int(ch.columns_of(xs, np.array([starts[i + 1]]))[0]) if i + 1 < len(spans) else end_col
        c1 = max(c1, c0 + 1)
        state = np.full(rows, ch.AGREED, np.uint8)
        for group, code in ((span.missing, ch.MISSING), (span.parted, ch.PARTED)):
            for r in group:
                if r in index:
                    row = index[r] // per_row
                    state[row] = max(state[row], code)
        grid[:, c0:c1] = np.maximum(grid[:, c0:c1], state[:, None])
    rgb = np.zeros((rows, ch.PLOT_W, 3), np.uint8)
    for code, colour in ch.STATE_RGB.items():
        rgb[grid == code] = colour
    svg = [
        ch.svg_open(height, "replica agreement per check, rank by step"),
        f'<rect class="frame" x="{ch.LEFT}" y="{top}" width="{ch.PLOT_W}" height="{ch.coord(grid_h)}"/>',
        ch.raster(rgb, ch.LEFT, top, ch.PLOT_W, grid_h),
        ch.rank_labels(ranks, per_row, top, row_h),
        f'<text class="at" transform="translate(14 {ch.coord(top + grid_h / 2)}) rotate(-90)" '
        f'text-anchor="middle">rank</text>',
        _bracket_svg(diag, xs, top, top + grid_h),
        ch.x_axis(xs, top + grid_h),
        "</svg>",
    ]
    binned = f" (rows of {per_row} ranks: a row is red when any of its ranks parted)" if per_row > 1 else ""
    legend = legend_html(
        [
            ("band", "#4caf50", "agreed with the majority"),
            ("band", "#d32f2f", "parted from it (or, without a majority, every side of the split)"),
            ("band", "#b0b6c0", "did not report"),
            ("band", "#ffffff", "before the first check"),
        ]
    )
    return title + "".join(svg) + legend + _span_table(spans, binned)


def _span_table(spans: list[AgreementSpan], binned: str) -> str:
    shown = spans if len(spans) <= _MAX_SPAN_ROWS else spans[: _MAX_SPAN_ROWS // 2] + spans[-_MAX_SPAN_ROWS // 2 :]
    rows = []
    for s in shown:
        steps = f"{s.first_step}" if s.first_step == s.last_step else f"{s.first_step}–{s.last_step}"
        if s.parted:
            who = fmt_ranks(s.parted)
            if s.no_majority:
                outcome = (
                    f'<span class="st bad">{escape_text(who)} disagree</span>: no majority of the {s.ranks} '
                    "says which side is right"
                )
            else:
                outcome = (
                    f'<span class="st bad">{escape_text(who)} parted</span> from the other '
                    f"{s.ranks - len(s.parted)} of {s.ranks}"
                )
        else:
            outcome = f'<span class="st ok">all {s.ranks} agreed</span>'
        if s.missing:
            who = fmt_ranks(s.missing)
            outcome += f'; <span class="st warn">{escape_text(who)} did not report</span>'
        rows.append(
            [
                escape_text(steps),
                escape_text(s.checks),
                outcome,
                escape_text(", ".join(s.what), limit=200),
                f"<code>{escape_text(s.tensor, limit=200)}</code>" if s.tensor else "",
            ]
        )
    cut = len(spans) - len(shown)
    caption = f"{len(spans)} run{'s' if len(spans) != 1 else ''} of checks with the same outcome{binned}" + (
        f"; {cut} in the middle left out (all in the JSON output)" if cut else ""
    )
    return table_html(
        ["steps", "checks", "outcome", "what differed", "first differing tensor"],
        rows,
        caption,
        cls=["nowrap", "num", "", "", ""],
    )


def _loss_chart(diag: Diagnosis, loss: dict[int, tuple[np.ndarray, np.ndarray]], xs: ch.Scale) -> str:
    top, bottom = ch.TOP + 8, ch.HEIGHT - ch.BOTTOM
    n = len(loss)
    envelope = n > ch.MAX_LINES
    ys = ch.value_scale([v for _, v in loss.values()], bottom, top)
    parts = [ch.svg_open(ch.HEIGHT, "loss per rank by step"), ch.y_axis(ys, "loss" + (" (log)" if ys.log else ""))]
    parts.append(_bracket_svg(diag, xs, top, bottom))
    legend: list[tuple[str, str, str]] = []
    if envelope:
        band, median = _envelope(loss, xs)
        cols_x = ch.LEFT + np.arange(ch.PLOT_W) + 0.5
        lo_px, hi_px = ys.px(band[0]), ys.px(band[1])
        parts.append(
            f'<path class="band" d="{ch.band_path(cols_x, lo_px, hi_px)}"><title>min–max over {n} ranks</title></path>'
        )
        parts.append(
            f'<path class="median" d="{ch.polyline_path(cols_x, ys.px(median))}"><title>median rank</title></path>'
        )
        legend += [("band", "#9ecae1", f"min–max over all {n} ranks"), ("line", "#08519c", "median over ranks")]
        drawn = [r for r in _highlighted(diag) if r in loss]
    else:
        drawn = list(loss)
    for i, rank in enumerate(drawn):
        colour = ch.PALETTE[i % len(ch.PALETTE)] if not envelope else ch.PALETTE[(i + 1) % len(ch.PALETTE)]
        steps, values = loss[rank]
        if envelope:  # over a band, a rank's own min-max would hide it: its mean per column
            x, y = ch.LEFT + np.arange(ch.PLOT_W) + 0.5, _column_mean(steps, values, xs)
            px, py = x, ys.px(y)
        else:
            x, y = downsample(steps, ch.finite_clipped(values), 2 * ch.PLOT_W)
            px, py = xs.px(x), ys.px(y)
        cls = "line hl" if envelope else "line"
        parts.append(
            f'<path class="{cls}" stroke="{colour}" d="{ch.polyline_path(px, py)}"><title>rank {rank}</title></path>'
        )
        if steps.size <= ch.MARKER_POINTS:
            ok = np.isfinite(px) & np.isfinite(py)
            parts.append(
                "".join(
                    f'<circle cx="{a:.1f}" cy="{b:.1f}" r="2.5" fill="{colour}"/>'
                    for a, b in zip(px[ok], py[ok], strict=True)
                )
            )
        legend.append(("line", colour, f"rank {rank}" + (" (singled out; its mean per column)" if envelope else "")))
    parts.append(_event_marks(diag.events, xs, top))
    parts.append(ch.x_axis(xs, bottom))
    parts.append("</svg>")
    if any(e for e in diag.events if _marked(e)):
        legend.append(("mark", "#e65100", "communication or process event (hover for the line)"))
    down = any(s.size > 2 * ch.PLOT_W for s, _ in loss.values())
    note = " (min and max per pixel column, so spikes stay visible)" if down else ""
    kind = "min–max envelope" if envelope else "one line per rank"
    return f"<h3>Loss per rank: {kind}{note}</h3>" + "".join(parts) + legend_html(legend)


def _envelope(
    loss: dict[int, tuple[np.ndarray, np.ndarray]], xs: ch.Scale
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per pixel column: the minimum and maximum over every rank, and the median of
    the ranks' column means."""
    lo = np.full(ch.PLOT_W, np.inf)
    hi = np.full(ch.PLOT_W, -np.inf)
    means = np.full((len(loss), ch.PLOT_W), np.nan)
    for i, (steps, values) in enumerate(loss.values()):
        ok = np.isfinite(values)
        v = ch.finite_clipped(values[ok])
        cols = ch.columns_of(xs, steps[ok])
        np.minimum.at(lo, cols, v)
        np.maximum.at(hi, cols, v)
        sums = np.bincount(cols, v, ch.PLOT_W)
        counts = np.bincount(cols, minlength=ch.PLOT_W)
        with np.errstate(invalid="ignore", divide="ignore"):
            means[i] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    lo[~np.isfinite(lo)] = np.nan
    hi[~np.isfinite(hi)] = np.nan
    with np.errstate(all="ignore"):
        have = np.isfinite(means).any(axis=0)
        median = np.full(ch.PLOT_W, np.nan)
        if have.any():
            median[have] = np.nanmedian(means[:, have], axis=0)
    return (lo, hi), median


def _column_mean(steps: np.ndarray, values: np.ndarray, xs: ch.Scale) -> np.ndarray:
    ok = np.isfinite(values)
    v = ch.finite_clipped(values[ok])
    cols = ch.columns_of(xs, steps[ok])
    sums = np.bincount(cols, v, ch.PLOT_W)
    counts = np.bincount(cols, minlength=ch.PLOT_W)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _marked(e: Event) -> bool:
    return (
        not e.benign
        and e.step is not None
        and e.kind in _MARKED_KINDS
        and not clean(e.raw).lstrip().startswith("syncdoctor:")
    )


def _event_marks(events: list[Event], xs: ch.Scale, top: float) -> str:
    marks = [e for e in events if _marked(e)][:_MAX_EVENT_MARKERS]
    out = []
    for e in marks:
        x = float(xs.px(e.step))  # type: ignore[arg-type]
        text = f"{clean(e.kind, oneline=True, limit=40)} · rank {fmt_num(e.rank)} · step {e.step} · {clean(e.raw, oneline=True, limit=160)}"
        out.append(f'<path class="evt" d="M{x - 5:.1f} {top - 10:.1f}h10l-5 8z"><title>{escape(text)}</title></path>')
    return "".join(out)


def _grad_chart(diag: Diagnosis, grad: dict[int, tuple[np.ndarray, np.ndarray]], xs: ch.Scale) -> str:
    what = {
        "local": "each rank's own gradient before the all-reduce",
        "reduced": "the gradient after the all-reduce (the same on every healthy rank)",
    }.get(diag.grad_norm_kind, "as logged")
    points = max(s.size for s, _ in grad.values())
    title = f"<h3>Gradient norm per rank: {what} ({points:,} measured step{'s' if points != 1 else ''} per rank)</h3>"
    if points <= 10 and diag.grad_norm_kind:
        title += (
            '<p class="detail">The probe measures gradient norms at its detailed checks only '
            "(step 1 and every 100th step or so); <code>--check-every 1</code> measures every step.</p>"
        )
    if len(grad) <= ch.MAX_LINES:
        return title + _grad_lines(grad, xs)
    return title + _grad_grid(diag, grad, xs)


def _grad_lines(grad: dict[int, tuple[np.ndarray, np.ndarray]], xs: ch.Scale) -> str:
    top, bottom = ch.TOP, ch.HEIGHT - ch.BOTTOM
    ys = ch.value_scale([v for _, v in grad.values()], bottom, top, log_ratio=1e2)
    parts = [
        ch.svg_open(ch.HEIGHT, "gradient norm per rank by step"),
        ch.y_axis(ys, "gradient norm" + (" (log)" if ys.log else "")),
    ]
    legend = []
    for i, (rank, (steps, values)) in enumerate(grad.items()):
        colour = ch.PALETTE[i % len(ch.PALETTE)]
        x, y = downsample(steps, ch.finite_clipped(values), 2 * ch.PLOT_W)
        px, py = xs.px(x), ys.px(y)
        parts.append(
            f'<path class="line" stroke="{colour}" d="{ch.polyline_path(px, py)}"><title>rank {rank}</title></path>'
        )
        if steps.size <= ch.MARKER_POINTS:
            ok = np.isfinite(px) & np.isfinite(py)
            parts.append(
                "".join(
                    f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"><title>rank {rank} · step {s:.0f} · {fmt_num(v)}</title></circle>'
                    for a, b, s, v in zip(px[ok], py[ok], x[ok], y[ok], strict=True)
                )
            )
        legend.append(("line", colour, f"rank {rank}"))
    parts += [ch.x_axis(xs, bottom), "</svg>"]
    return "".join(parts) + legend_html(legend)


def _grad_grid(diag: Diagnosis, grad: dict[int, tuple[np.ndarray, np.ndarray]], xs: ch.Scale) -> str:
    ranks = sorted(grad)
    per_row = ch.rank_bins(len(ranks))
    rows = math.ceil(len(ranks) / per_row)
    row_h = max(1.0, min(18.0, 240.0 / rows))
    top = ch.TOP
    grid_h = rows * row_h
    z = np.full((rows, ch.PLOT_W), np.nan)
    for i, rank in enumerate(ranks):
        steps, values = grad[rank]
        ok = np.isfinite(values) & (values > 0)
        if not ok.any():
            continue
        cols = ch.columns_of(xs, steps[ok])
        line = np.full(ch.PLOT_W, np.nan)
        np.fmax.at(line, cols, np.log10(values[ok]))
        # Between two measurements a rank keeps its last value, up to its last one
        # plus the usual gap: sparse measurements fill their stretch of the run.
        gap = int(np.median(np.diff(np.unique(cols)))) if np.unique(cols).size > 1 else 1
        have = np.where(np.isfinite(line), np.arange(ch.PLOT_W), -1)
        last = np.maximum.accumulate(have)
        filled = np.where(last >= 0, line[np.maximum(last, 0)], np.nan)
        filled[min(ch.PLOT_W, int(cols.max()) + max(gap, 1)) :] = np.nan
        row = i // per_row
        z[row] = np.fmax(z[row], filled)
    finite = z[np.isfinite(z)]
    zlo, zhi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if zhi <= zlo:
        zhi = zlo + 1e-9
    rgb = ch.viridis((z - zlo) / (zhi - zlo))
    height = int(top + grid_h + ch.BOTTOM)
    svg = [
        ch.svg_open(height, "gradient norm, rank by step"),
        ch.raster(rgb, ch.LEFT, top, ch.PLOT_W, grid_h),
        f'<rect class="frame" x="{ch.LEFT}" y="{top}" width="{ch.PLOT_W}" height="{ch.coord(grid_h)}"/>',
        ch.rank_labels(ranks, per_row, top, row_h),
        f'<text class="at" transform="translate(14 {ch.coord(top + grid_h / 2)}) rotate(-90)" text-anchor="middle">rank</text>',
        ch.x_axis(xs, top + grid_h),
        "</svg>",
    ]
    binned = f"; rows of {per_row} ranks show their largest norm" if per_row > 1 else ""
    scale = (
        f'<p class="legend"><span class="lg"><i class="band cbar"></i>'
        f"gradient norm {fmt_num(10**zlo)} … {fmt_num(10**zhi)} (log colour scale; each measurement "
        f"held until the rank's next{binned})</span></p>"
    )
    return "".join(svg) + scale


CSS = """
.sdr{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 48px;color:#1d2330}
.sdr h1{font-size:22px;margin:18px 0 6px}.sdr h2{font-size:18px;border-bottom:1px solid #d8dce5;padding-bottom:4px;margin-top:28px}
.sdr h3{font-size:15px;margin:18px 0 6px}.sdr h4{font-size:13px;margin:10px 0 4px;text-transform:uppercase;color:#5a6475}
.sdr .verdict{display:inline-block;font-weight:700;padding:6px 12px;border-radius:6px;margin:4px 0}
.sdr .verdict.ok,.sdr .tag.ok{background:#e3f6e8;color:#13612e}.sdr .verdict.bad,.sdr .tag.bad{background:#fde6e6;color:#9b1c1c}
.sdr .verdict.warn,.sdr .tag.warn{background:#fff4d6;color:#7a5200}.sdr .verdict.info,.sdr .tag.info{background:#e4edfb;color:#1f4e99}
.sdr span.ok{color:#13612e}.sdr span.bad{color:#9b1c1c;font-weight:600}.sdr span.warn{color:#7a5200;font-weight:600}
.sdr .tag{display:inline-block;white-space:nowrap;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.sdr .meta,.sdr .detail{color:#5a6475}
.sdr .finding{border:1px solid #d8dce5;border-left:5px solid #8a94a6;border-radius:6px;padding:8px 14px;margin:10px 0}
.sdr .finding.error{border-left-color:#c62828}.sdr .finding.warning{border-left-color:#e0a100}.sdr .finding.info{border-left-color:#3b73c4}
.sdr .finding.top{box-shadow:0 1px 4px rgba(0,0,0,.12)}
.sdr dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}.sdr dt{color:#5a6475}.sdr dd{margin:0;overflow-wrap:anywhere}
.sdr .fix{background:#f2f8f3;padding:6px 10px;border-radius:4px;white-space:pre-wrap}
.sdr svg.chart{width:100%;height:auto;display:block;font-size:12px}
.sdr svg .axis{stroke:#5a6475;stroke-width:1}.sdr svg .tick{stroke:#5a6475}.sdr svg .grid{stroke:#e6e9ef;stroke-width:1}
.sdr svg .tl{fill:#3a4250;font-size:11px}.sdr svg .at{fill:#3a4250;font-size:12px;font-weight:600}
.sdr svg .line{fill:none;stroke-width:1.4;stroke-linejoin:round}.sdr svg .line.hl{stroke-width:.9;stroke-opacity:.85}.sdr svg .median{fill:none;stroke:#08519c;stroke-width:1.4}
.sdr svg .band{fill:#9ecae1;fill-opacity:.7;stroke:none}.sdr svg .frame{fill:none;stroke:#b0b6c0}
.sdr svg .bracket{fill:#d32f2f;fill-opacity:.15}.sdr svg .div{stroke:#c62828;stroke-width:1.5;stroke-dasharray:5 3}
.sdr svg .divl{fill:#c62828;font-size:12px;font-weight:600}.sdr svg .evt{fill:#e65100}
.sdr .legend{margin:2px 0 10px;color:#3a4250;font-size:12px}.sdr .lg{margin-right:14px;white-space:nowrap}
.sdr .lg i{display:inline-block;vertical-align:middle;margin-right:5px}.sdr .lg i.line{width:18px;height:3px}
.sdr .lg i.band{width:14px;height:10px;border:1px solid #b0b6c0}.sdr .lg i.mark{width:9px;height:9px;clip-path:polygon(0 0,100% 0,50% 100%)}
.sdr .lg i.cbar{width:120px;background:linear-gradient(90deg,#440154,#3b518b,#21918c,#5cc863,#fde725)!important}
.sdr table{border-collapse:collapse;width:100%;font-size:13px}.sdr caption{text-align:left;color:#5a6475;padding:4px 0}
.sdr th,.sdr td{border-bottom:1px solid #e6e9ef;padding:3px 8px;text-align:left;vertical-align:top}
.sdr td{overflow-wrap:anywhere}.sdr td.nowrap,.sdr th.nowrap,.sdr td.num{white-space:nowrap;overflow-wrap:normal}
.sdr td.num{text-align:right;font-variant-numeric:tabular-nums}
.sdr code{white-space:pre-wrap;font-size:12px}
.sdr li{overflow-wrap:anywhere}
"""

"""The diagnosis as one self-contained HTML file that works offline.

Safety model: the page shows text taken from logs written by whatever ran on the
cluster, so every such string is cleaned (:func:`clean`) and HTML-escaped where it
is inserted; chart data reaches JavaScript only through a non-executed
``application/json`` block whose ``<``, ``>`` and ``&`` are written as ``\\u003c``
etc., so no log line can close the block or open a tag. On top of that a
Content-Security-Policy allows exactly the two inline scripts written here (by
SHA-256 hash), no network access at all, and no plugins, so even an escaping bug
could not run a script or phone home.

Size: plotly.js (~4.8 MB) is embedded once; each rank's series is reduced with a
min/max-per-bucket downsampler (spikes survive) to at most 2,000 points, and fewer
when there are many ranks, so a 256-rank × 10,000-step run stays around 10 MB.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from html import escape
from itertools import chain
from typing import Any

import numpy as np
import plotly
from plotly.offline import get_plotlyjs

from syncdoctor.doctor.model import DIAGNOSIS_SCHEMA, Diagnosis, Event, Finding, LossShape
from syncdoctor.doctor.report.common import (
    VERDICT_TEXT,
    clean,
    fmt_num,
    fmt_ranks,
    shape_line,
    shapes_by_rank,
    summarize_events,
)

MAX_POINTS_PER_RANK = 2000
_TOTAL_POINT_BUDGET = 300_000  # across all ranks: keeps the file and the SVG light
_MIN_POINTS_PER_RANK = 200
_HEATMAP_MAX_BINS = 400
_MAX_EVENT_MARKERS = 2000
_MAX_EVENT_ROWS = 200
_PLOT_CLIP = 1e300  # plotly's axis maths overflows near 1.8e308 (range padding)

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


def render_html(diag: Diagnosis, title: str = "syncdoctor report") -> str:
    """Return the complete HTML page for ``diag``."""
    data = _chart_data(diag)
    data_json = _script_safe_json(data)
    app_js = _APP_JS
    plotly_js = get_plotlyjs().replace(
        "</script", "<\\/script"
    )  # never present today; cheap insurance
    csp = (
        "default-src 'none'; "
        f"script-src {_csp_hash(plotly_js)} {_csp_hash(app_js)}; "
        "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; "
        "connect-src 'none'; base-uri 'none'; form-action 'none'"
    )
    body = "\n".join(
        [
            _header(diag, title),
            _shape_section(diag),
            _findings_section(diag.findings),
            _charts_section(diag, data),
            _ranks_section(diag),
            _events_section(diag.events),
            _list_section("Input warnings", diag.warnings, "warnings"),
            _list_section("Sources", diag.sources, "sources"),
        ]
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{escape(csp)}">\n'
        '<meta name="referrer" content="no-referrer">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(clean(title, oneline=True))}</title>\n"
        f"<style>{_CSS}</style>\n"
        f"<script>{plotly_js}</script>\n"
        "</head><body>\n"
        f"{body}\n"
        f'<script type="application/json" id="sd-data">{data_json}</script>\n'
        f"<script>{app_js}</script>\n"
        "</body></html>\n"
    )


# --- text sections -----------------------------------------------------------------------------


def _e(text: object, limit: int | None = None, oneline: bool = False) -> str:
    """Untrusted text → inert HTML text."""
    return escape(clean(text, oneline=oneline, limit=limit), quote=True)


def _header(diag: Diagnosis, title: str) -> str:
    cls = _VERDICT_CLASS.get(diag.verdict, "info")
    verdict = VERDICT_TEXT.get(diag.verdict, str(diag.verdict))
    div = (
        f"<p>Ranks diverge from step <b>{_e(diag.divergence_step)}</b>.</p>"
        if diag.divergence_step is not None
        else ""
    )
    return (
        f"<header><h1>{_e(title, oneline=True)}</h1>"
        f'<p class="verdict {cls}">{_e(verdict)}</p>{div}'
        f'<p class="meta">{_e(DIAGNOSIS_SCHEMA)} · plotly {_e(plotly.__version__)}</p></header>'
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
        f'<p><span class="tag {cls}">{_e(shape.shape)}</span> {_e(shape_line(shape))}'
        f'{f" · {_e(nums)}" if nums else ""}</p><p class="detail">{_e(shape.detail)}</p>'
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
        ("confidence", f"{fmt_num(f.confidence * 100, 3)} %"),
        ("step", f.step),
        ("ranks", fmt_ranks(f.ranks) if f.ranks else None),
        ("tensor", f.tensor),
    ]
    dl = "".join(f"<dt>{k}</dt><dd>{_e(v, limit=300)}</dd>" for k, v in facts if v is not None)
    evidence = "".join(f"<li>{_e(x, limit=2000)}</li>" for x in f.evidence)
    sev = f.severity if f.severity in ("error", "warning", "info") else "info"
    return (
        f'<article class="finding {sev}{" top" if top else ""}">'
        f"<h3>{_e(f.title, oneline=True)}</h3><dl>{dl}</dl>"
        f"{f'<h4>Evidence</h4><ul>{evidence}</ul>' if evidence else ''}"
        f"{f'<h4>Fix</h4><p class=fix>{_e(f.fix)}</p>' if f.fix else ''}</article>"
    )


def _findings_section(findings: list[Finding]) -> str:
    if not findings:
        return '<section id="findings"><h2>Findings</h2><p>No findings.</p></section>'
    cards = "".join(_finding_html(f, i == 0) for i, f in enumerate(findings))
    return f'<section id="findings"><h2>Findings</h2>{cards}</section>'


def _charts_section(diag: Diagnosis, data: dict[str, Any]) -> str:
    parts = ['<section id="charts"><h2>Charts</h2>']
    parts.append(
        "<noscript><p>Charts need JavaScript; the tables below hold the same facts.</p></noscript>"
        '<p id="sd-chart-status" class="detail" role="status">Drawing charts…</p>'
    )
    if data["loss"]:
        note = (
            " (downsampled: min and max per bucket, so spikes stay visible)" if data["down"] else ""
        )
        parts.append(f'<h3>Loss per rank{note}</h3><div id="sd-loss" class="chart"></div>')
    if data["heat"] is not None:
        parts.append(
            "<h3>Gradient norm, rank × step (log10; max per step bucket; non-finite left blank)</h3>"
            '<div id="sd-heat" class="chart"></div>'
        )
    if not data["loss"] and data["heat"] is None:
        parts.append("<p>No series to plot.</p>")
    parts.append("</section>")
    return "".join(parts)


def _table(headers: list[str], rows: list[list[str]], caption: str = "") -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    cap = f"<caption>{caption}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _ranks_section(diag: Diagnosis) -> str:
    if not diag.ranks:
        return ""
    shapes = shapes_by_rank(diag)
    rows = []
    for r in diag.ranks:
        shape = shapes.get(r.rank)
        shape_cell = (
            f'<span class="tag {_SHAPE_CLASS.get(shape.shape, "info")}" title="{_e(shape.detail)}">'
            f"{_e(shape.shape)}</span>"
            if shape
            else ""
        )
        status_cls = "ok" if r.status == "ok" else ("bad" if r.status else "")
        rows.append(
            [
                _e(r.rank),
                _e(fmt_num(r.steps)),
                _e(fmt_num(r.last_loss)),
                _e(fmt_num(r.mean_loss)),
                _e(fmt_num(r.grad_norm)),
                shape_cell,
                f'<span class="{status_cls}">{_e(r.status, limit=40)}</span>',
                _e(r.note, limit=500),
            ]
        )
    headers = ["rank", "steps", "last loss", "mean loss", "grad norm", "shape", "status", "note"]
    return f'<section id="ranks"><h2>Per rank</h2>{_table(headers, rows)}</section>'


def _event_row(e: Event) -> list[str]:
    src = clean(e.source, oneline=True, limit=200) + (f":{e.line}" if e.line is not None else "")
    return [
        _e(e.kind, limit=40),
        _e(fmt_num(e.rank)),
        _e(fmt_num(e.step)),
        _e(e.host, limit=80) if e.host else "",
        f"<code>{_e(e.raw, limit=1000)}</code>",
        escape(src),
    ]


def _events_section(events: list[Event]) -> str:
    if not events:
        return ""
    summary = summarize_events(events, limit=_MAX_EVENT_ROWS)
    counts = ", ".join(
        f"{_e(kind, limit=40)} {total}" + (f" ({benign} benign)" if benign else "")
        for kind, total, benign in summary.counts
    )
    more = summary.notable_total - len(summary.notable)
    caption = f"first {len(summary.notable)} of {summary.notable_total} non-benign events" + (
        f"; {more} more in the JSON output" if more else ""
    )
    table = (
        _table(
            ["kind", "rank", "step", "host", "line", "source"],
            [_event_row(e) for e in summary.notable],
            caption,
        )
        if summary.notable
        else "<p>All events are known-benign.</p>"
    )
    return f'<section id="events"><h2>Events</h2><p>{counts}</p>{table}</section>'


def _list_section(heading: str, items: list[str], anchor: str) -> str:
    if not items:
        return ""
    lis = "".join(f"<li>{_e(x, limit=2000)}</li>" for x in items)
    return f'<section id="{anchor}"><h2>{escape(heading)}</h2><ul>{lis}</ul></section>'


# --- chart data --------------------------------------------------------------------------------


def _chart_data(diag: Diagnosis) -> dict[str, Any]:
    n_ranks = max(len(diag.loss_series), 1)
    per_rank = min(MAX_POINTS_PER_RANK, max(_MIN_POINTS_PER_RANK, _TOTAL_POINT_BUDGET // n_ranks))
    loss = []
    down = False
    positive_min, overall_max = math.inf, -math.inf
    for rank in sorted(diag.loss_series):
        steps, values = _as_arrays(diag.loss_series[rank])
        if steps.size == 0:
            continue
        down |= steps.size > per_rank
        x, y = downsample(steps, values, per_rank)
        finite = y[np.isfinite(y)]
        if finite.size:
            pos = finite[finite > 0]
            if pos.size:
                positive_min = min(positive_min, float(pos.min()))
            overall_max = max(overall_max, float(finite.max()))
        loss.append({"r": int(rank), "x": _compact(x), "y": _compact(y)})
    # A loss that spans many decades (a blow-up) is unreadable on a linear axis.
    # Zeros (and -0.0) are allowed on the log axis; plotly just leaves them out.
    no_negative = all(v is None or v >= 0 for s in loss for v in s["y"])
    log_y = positive_min < math.inf and no_negative and overall_max / positive_min > 1e3

    events = [e for e in diag.events if not e.benign and e.step is not None]
    markers = [
        {
            "x": int(e.step),  # type: ignore[arg-type]
            "k": clean(e.kind, oneline=True, limit=40),
            # plotly hover text understands a little HTML and decodes entities, so
            # it gets escaped text (shown literally), never raw log text.
            "t": escape(
                f"{clean(e.kind, oneline=True, limit=40)} · rank {fmt_num(e.rank)} · step {e.step}"
                f" · {clean(e.raw, oneline=True, limit=160)}"
            ),
        }
        for e in events[:_MAX_EVENT_MARKERS]
    ]
    return {
        "loss": loss,
        "down": down,
        "logy": log_y,
        "div": diag.divergence_step,
        "events": markers,
        "heat": _heatmap(diag.grad_norm_series),
    }


def _as_arrays(pairs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """[[step, value], ...] → (steps, values) sorted by step, rows without a step dropped."""
    try:
        # Twice as fast as np.asarray on nested lists, which matters at 256 × 10k.
        arr = np.fromiter(chain.from_iterable(pairs), float, count=2 * len(pairs)).reshape(-1, 2)
    except (TypeError, ValueError):  # ragged or odd rows: let numpy say what is wrong
        arr = np.asarray(pairs, dtype=float).reshape(-1, 2)
    arr = arr[np.isfinite(arr[:, 0])]
    order = np.argsort(arr[:, 0], kind="stable")
    return arr[order, 0], arr[order, 1]


def downsample(x: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points that keep each bucket's minimum and maximum.

    Plain striding would drop exactly the one-step spikes a reader is looking for.
    A bucket holding a non-finite value keeps a NaN point so the line shows a gap
    where the loss blew up.
    """
    n = x.size
    if n <= max_points:
        return x, y
    buckets = max(max_points // 2, 1)
    size = math.ceil(n / buckets)
    buckets = math.ceil(n / size)
    pad = buckets * size - n
    yv = np.concatenate([y, np.full(pad, np.nan)]).reshape(buckets, size)
    bad = np.concatenate([~np.isfinite(y), np.zeros(pad, bool)]).reshape(buckets, size)
    finite = np.isfinite(yv)
    lo = np.argmin(np.where(finite, yv, np.inf), axis=1)
    hi = np.argmax(np.where(finite, yv, -np.inf), axis=1)
    # Keep the two picks of a bucket in step order.
    base = np.arange(buckets) * size
    idx = np.minimum(
        np.stack([base + np.minimum(lo, hi), base + np.maximum(lo, hi)], 1).ravel(), n - 1
    )
    xs, ys = x[idx], y[idx].copy()
    # A bucket that held a NaN/inf turns its second pick into a gap in the line.
    ys[1::2][bad.any(axis=1)] = np.nan
    return xs, ys


def _compact(a: np.ndarray) -> list[float | int | None]:
    """JSON-ready numbers with 6 significant digits (halves the text), None for non-finite."""
    a = np.asarray(a, dtype=float)
    finite = np.isfinite(a)
    if finite.all() and np.all(a == np.round(a)) and np.all(np.abs(a) < 2**53):
        return a.astype(np.int64).tolist()  # steps: plain integers
    out = np.where(finite, np.clip(a, -_PLOT_CLIP, _PLOT_CLIP), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.floor(np.log10(np.abs(out)))
    mag = np.where(np.isfinite(mag), mag, 0.0)
    scale = 10.0 ** (5 - mag)
    rounded = np.where(np.abs(mag) < 290, np.round(out * scale) / scale, out)
    values: list[float | int | None] = rounded.tolist()
    if not finite.all():
        for i in np.flatnonzero(~finite):
            values[i] = None
    return values


def _heatmap(series: dict[int, list[list[float]]]) -> dict[str, Any] | None:
    ranks = [r for r in sorted(series) if len(series[r])]
    if not ranks:
        return None
    arrays = [_as_arrays(series[r]) for r in ranks]
    lo = min(float(s.min()) for s, _ in arrays if s.size)
    hi = max(float(s.max()) for s, _ in arrays if s.size)
    span = int(hi - lo) + 1
    bins = max(1, min(_HEATMAP_MAX_BINS, span))
    width = span / bins
    z = np.full((len(ranks), bins), np.nan)
    for row, (steps, values) in enumerate(arrays):
        ok = np.isfinite(values) & (values > 0)
        idx = np.minimum(((steps[ok] - lo) / width).astype(np.int64), bins - 1)
        np.fmax.at(z[row], idx, np.log10(values[ok]))
    x = lo + np.arange(bins) * width
    return {
        "ranks": ranks,
        "x": _compact(np.floor(x)),
        "z": [_compact(row) for row in z],
        "w": width,
    }


# --- embedding ---------------------------------------------------------------------------------


def _script_safe_json(data: Any) -> str:
    """JSON that cannot end its <script> block or start a comment/tag inside it."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (
        text.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _csp_hash(script: str) -> str:
    digest = hashlib.sha256(script.encode("utf-8")).digest()
    return f"'sha256-{base64.b64encode(digest).decode('ascii')}'"


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 48px;color:#1d2330}
h1{font-size:22px;margin:18px 0 6px}h2{font-size:18px;border-bottom:1px solid #d8dce5;padding-bottom:4px;margin-top:28px}
h3{font-size:15px;margin:14px 0 6px}h4{font-size:13px;margin:10px 0 4px;text-transform:uppercase;color:#5a6475}
.verdict{display:inline-block;font-weight:700;padding:6px 12px;border-radius:6px;margin:4px 0}
.verdict.ok,.tag.ok{background:#e3f6e8;color:#13612e}.verdict.bad,.tag.bad{background:#fde6e6;color:#9b1c1c}
.verdict.warn,.tag.warn{background:#fff4d6;color:#7a5200}.verdict.info,.tag.info{background:#e4edfb;color:#1f4e99}
span.ok{color:#13612e}span.bad{color:#9b1c1c}
.tag{display:inline-block;white-space:nowrap;padding:1px 8px;border-radius:10px;font-weight:600;font-size:12px}
.meta,.detail{color:#5a6475}
.finding{border:1px solid #d8dce5;border-left:5px solid #8a94a6;border-radius:6px;padding:8px 14px;margin:10px 0}
.finding.error{border-left-color:#c62828}.finding.warning{border-left-color:#e0a100}.finding.info{border-left-color:#3b73c4}
.finding.top{box-shadow:0 1px 4px rgba(0,0,0,.12)}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:6px 0}dt{color:#5a6475}dd{margin:0;overflow-wrap:anywhere}
.fix{background:#f2f8f3;padding:6px 10px;border-radius:4px;white-space:pre-wrap}
.chart{width:100%;height:460px}
table{border-collapse:collapse;width:100%;font-size:13px}caption{text-align:left;color:#5a6475;padding:4px 0}
th,td{border-bottom:1px solid #e6e9ef;padding:3px 8px;text-align:left;vertical-align:top}
td{overflow-wrap:anywhere}code{white-space:pre-wrap;font-size:12px}
li{overflow-wrap:anywhere}
"""

# Reads the JSON block and draws; any failure is shown on the page (and marks
# <body data-charts="failed">) instead of leaving empty boxes.
_APP_JS = """
(function () {
  "use strict";
  var status = document.getElementById("sd-chart-status");
  function fail(msg) {
    document.body.setAttribute("data-charts", "failed");
    if (status) { status.textContent = "Charts could not be drawn: " + msg; }
  }
  window.addEventListener("error", function (ev) { fail(String(ev.message)); });
  if (typeof Plotly === "undefined") { fail("plotly.js did not load"); return; }
  try {
    var D = JSON.parse(document.getElementById("sd-data").textContent);
    var config = {displaylogo: false, responsive: true};
    var jobs = [];
    if (D.loss.length && document.getElementById("sd-loss")) {
      var many = D.loss.length > 32;
      var traces = D.loss.map(function (s) {
        return {type: "scatter", mode: "lines", name: "rank " + s.r, x: s.x, y: s.y,
                line: {width: many ? 0.8 : 1.4}, connectgaps: false,
                hovertemplate: "rank " + s.r + "<br>step %{x}<br>loss %{y:.4g}<extra></extra>"};
      });
      var shapes = [], annotations = [];
      if (D.div !== null) {
        shapes.push({type: "line", xref: "x", yref: "paper", x0: D.div, x1: D.div, y0: 0, y1: 1,
                     line: {color: "#c62828", width: 2, dash: "dash"}});
        annotations.push({x: D.div, xref: "x", y: 1, yref: "paper", yanchor: "bottom",
                          text: "ranks diverge (step " + D.div + ")", showarrow: false,
                          font: {color: "#c62828"}});
      }
      if (D.events.length) {
        traces.push({type: "scatter", mode: "markers", name: "comm events", yaxis: "y2",
                     x: D.events.map(function (e) { return e.x; }),
                     y: D.events.map(function () { return 0.97; }),
                     text: D.events.map(function (e) { return e.t; }),
                     hovertemplate: "%{text}<extra></extra>",
                     marker: {symbol: "triangle-down", size: 10, color: "#e65100"}});
      }
      var layout = {margin: {t: 30, r: 20, b: 45, l: 60}, hovermode: "closest",
                    showlegend: !many, legend: {orientation: "h"},
                    xaxis: {title: {text: "step"}},
                    yaxis: {title: {text: "loss"}, type: D.logy ? "log" : "linear"},
                    yaxis2: {overlaying: "y", range: [0, 1], visible: false, fixedrange: true},
                    shapes: shapes, annotations: annotations};
      jobs.push(Plotly.newPlot("sd-loss", traces, layout, config));
    }
    if (D.heat && document.getElementById("sd-heat")) {
      var h = D.heat;
      jobs.push(Plotly.newPlot("sd-heat", [{
        type: "heatmap", x: h.x, y: h.ranks, z: h.z, colorscale: "Viridis",
        colorbar: {title: {text: "log10 norm"}}, hoverongaps: false,
        hovertemplate: "rank %{y}<br>steps from %{x}<br>log10 norm %{z:.3g}<extra></extra>"
      }], {margin: {t: 20, r: 20, b: 45, l: 60}, xaxis: {title: {text: "step"}},
           yaxis: {title: {text: "rank"}, tickformat: "d",
                   dtick: Math.max(1, Math.ceil(h.ranks.length / 16))}}, config));
    }
    Promise.all(jobs).then(function () {
      document.body.setAttribute("data-charts", "drawn");
      if (status) { status.textContent = ""; }
    }, function (err) { fail(String(err)); });
  } catch (err) {
    fail(String(err && err.message ? err.message : err));
  }
})();
"""

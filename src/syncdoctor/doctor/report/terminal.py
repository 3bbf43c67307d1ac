"""The diagnosis in a terminal, readable at a glance.

Every string that came from a log or a record goes through :func:`clean` (escape
sequences and control characters removed) and into a :class:`rich.text.Text`,
which rich never parses for markup, so a log line holding ``[bold]`` or
``\\x1b]0;title\\x07`` prints literally and cannot restyle or retitle the terminal.
"""

from __future__ import annotations

from rich.console import Console, Group, JustifyMethod
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from syncdoctor.doctor.model import (
    BASELINE_VERDICT_TEXT,
    VERDICT_TEXT,
    BaselineComparison,
    Diagnosis,
    Event,
    Finding,
    RankSummary,
    confidence_text,
)
from syncdoctor.doctor.report.common import (
    MAX_RANK_ROWS,
    SHAPE_STYLE,
    VERDICT_STYLE,
    bracket_text,
    clean,
    envelope,
    fmt_num,
    needs_attention,
    shape_line,
    shapes_by_rank,
    summarize_events,
)
from syncdoctor.records import stages
from syncdoctor.rulebook import fmt_ranks

_MAX_EVENTS = 8
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def render_terminal(diag: Diagnosis, console: Console | None = None) -> None:
    """Print the diagnosis: verdict, loss shape, top cause, other findings, ranks, events, warnings."""
    console = console or Console()
    out = console.print

    style = VERDICT_STYLE.get(diag.verdict, "white")
    verdict = _t(f" {VERDICT_TEXT.get(diag.verdict, diag.verdict)} ", f"bold reverse {style}")
    out(Text.assemble(_t("Verdict ", "bold"), verdict))
    for line in diag.coverage:
        out(_bullet(clean(line, oneline=True), "dim"))

    if diag.loss_shape is not None:
        shape = diag.loss_shape
        out(
            Text.assemble(
                _t("Loss shape ", "bold"),
                _t(clean(shape_line(shape), oneline=True), SHAPE_STYLE.get(shape.shape, "")),
            )
        )
        if shape.detail:
            out(_t("  " + clean(shape.detail, oneline=True), "dim"))
    if diag.divergence_step is not None:
        out(Text.assemble(_t("Replicas parted ", "bold"), _t(bracket_text(diag))))

    if diag.baseline is not None:
        out(_baseline(diag.baseline))

    if diag.findings:
        out(_top_finding(diag.findings[0]))
        if len(diag.findings) > 1:
            out(_t("Other findings", "bold"))
            for f in diag.findings[1:]:
                out(_compact_finding(f))
    else:
        out(_t("No findings.", "dim"))

    if diag.ranks:
        out(_rank_table(diag))
    if diag.events:
        out(_events(diag.events))
    if diag.run:
        out(_t("Run", "bold"))
        for key, value in diag.run.items():
            out(_bullet(f"{key}: " + clean(value, oneline=True, limit=400), "dim"))
    if diag.warnings:
        out(_t("Input warnings", "bold yellow"))
        for w in diag.warnings:
            out(_bullet(clean(w, oneline=True), "yellow"))


_BASELINE_STYLE = {
    "agree": "green",
    "better": "green",
    "parallel_part": "red",
    "not_parallel_part": "yellow",
    "inconclusive": "blue",
}


_SHAPE_LINES = ("this run's loss shape:", "the baseline's loss shape:")


def _baseline(cmp: BaselineComparison) -> Group:
    """The comparison with a baseline run: its verdict, then the evidence lines."""
    lines: list[Text] = [
        Text.assemble(
            _t("Against the baseline ", "bold"),
            _t(BASELINE_VERDICT_TEXT.get(cmp.verdict, cmp.verdict), f"bold {_BASELINE_STYLE.get(cmp.verdict, '')}"),
            _t("  " + clean(cmp.path, oneline=True, limit=120), "dim"),
        )
    ]
    shapes = " / ".join(s.shape if s else "no curve" for s in (cmp.run_shape, cmp.baseline_shape))
    lines.append(_bullet(f"loss shape, this run / baseline: {shapes}", "dim"))
    # The shapes' own explanations are in the JSON and the HTML; here one line each is enough.
    lines.extend(
        _bullet(clean(e, oneline=True, limit=400), "dim") for e in cmp.evidence if not e.startswith(_SHAPE_LINES)
    )
    return Group(*lines)


def _t(text: str, style: str = "") -> Text:
    # Text() never interprets markup or emoji codes, unlike a plain str passed to print().
    return Text(text, style=style)


def _bullet(text: str, style: str = "") -> Text:
    return Text.assemble(("  • ", style), (text, ""))


def _finding_meta(f: Finding) -> Text:
    # Codes and categories come from our analyses, but findings may quote records,
    # so every field is cleaned like log text.
    meta = Text()
    meta.append(clean(f.code, oneline=True, limit=60), style="bold")
    meta.append("  " + clean(f.category, oneline=True, limit=60), style="magenta")
    meta.append("  " + clean(f.severity, oneline=True, limit=20), style=_SEVERITY_STYLE.get(f.severity, ""))
    meta.append("  confidence " + confidence_text(f, fmt_num(f.confidence * 100, 3)))
    if f.step is not None:
        meta.append(f"  step {f.step}")
    if f.ranks:
        meta.append(f"  {fmt_ranks(f.ranks)}")
    if stages.name(f.stage):
        meta.append(f"  stage: {stages.name(f.stage)}", style="cyan")
    if f.tensor:
        meta.append("  tensor " + clean(f.tensor, oneline=True, limit=120), style="italic")
    return meta


def _top_finding(f: Finding) -> Panel:
    body: list[Text] = [_finding_meta(f)]
    if f.evidence:
        body.append(_t("Evidence", "bold"))
        body.extend(_bullet(clean(e, oneline=True, limit=400)) for e in f.evidence)
    if f.fix:
        body.append(Text.assemble(("Fix ", "bold green"), (clean(f.fix), "")))
    title = _t(clean(f.title, oneline=True, limit=160), "bold")
    return Panel(
        Group(*body),
        title=title,
        title_align="left",
        border_style=_SEVERITY_STYLE.get(f.severity, "white").split()[-1],
    )


def _compact_finding(f: Finding) -> Text:
    line = Text("  • ")
    line.append(clean(f.title, oneline=True, limit=120), style="bold")
    line.append("  ")
    line.append_text(_finding_meta(f))
    if f.evidence:
        line.append("\n    " + clean(f.evidence[0], oneline=True, limit=200), style="dim")
    return line


def _rank_table(diag: Diagnosis) -> Table:
    shapes = shapes_by_rank(diag)
    rows = diag.ranks
    hidden = 0
    ordinary: list[RankSummary] = []
    if len(rows) > MAX_RANK_ROWS:
        # With hundreds of ranks only the ones that stand out are worth a line.
        flagged = [r for r in rows if needs_attention(r, shapes)]
        ordinary = [r for r in rows if not needs_attention(r, shapes)]
        hidden = len(rows) - len(flagged)
        rows = flagged
    table = Table(title="Per rank", title_justify="left", show_edge=False, pad_edge=False)
    justify: JustifyMethod
    for name, justify in (
        ("rank", "right"),
        ("steps", "right"),
        ("last loss", "right"),
        ("mean loss", "right"),
        ("grad norm", "right"),
        ("shape", "left"),
        ("status", "left"),
        ("note", "left"),
    ):
        table.add_column(name, justify=justify, overflow="fold")
    for r in rows:
        shape = shapes.get(r.rank)
        status_style = "green" if r.status == "ok" else ("red" if r.status else "")
        table.add_row(
            _t(str(r.rank)),
            _t(fmt_num(r.steps)),
            _t(fmt_num(r.last_loss)),
            _t(fmt_num(r.mean_loss)),
            _t(fmt_num(r.grad_norm)),
            _t(shape.shape if shape else "", SHAPE_STYLE.get(shape.shape, "") if shape else ""),
            _t(clean(r.status, oneline=True, limit=40), status_style),
            _t(clean(r.note, oneline=True, limit=120)),
        )
    if hidden:
        table.caption = f"{hidden} more rank(s) look ordinary and are not listed" + (
            f": {envelope(ordinary)}" if envelope(ordinary) else ""
        )
    return table


def _events(events: list[Event]) -> Group:
    summary = summarize_events(events, limit=_MAX_EVENTS)
    counts = Text("Events ", style="bold")
    for i, (kind, total, benign) in enumerate(summary.counts):
        if i:
            counts.append(", ")
        counts.append(f"{clean(kind, oneline=True, limit=30)} {total}")
        if benign:
            counts.append(f" ({benign} benign)", style="dim")
    lines: list[Text] = [counts]
    for e in summary.notable:
        where = " ".join(
            p
            for p in (
                f"rank {e.rank}" if e.rank is not None else "",
                f"step {e.step}" if e.step is not None else "",
            )
            if p
        )
        line = Text("  • ")
        line.append(clean(e.kind, oneline=True, limit=30), style="bold yellow")
        if where:
            line.append(f" {where}")
        line.append("  " + clean(e.raw, oneline=True, limit=160))
        src = clean(e.source, oneline=True, limit=80)
        line.append(f"  ({src}{':' + str(e.line) if e.line is not None else ''})", style="dim")
        lines.append(line)
    if summary.notable_total > len(summary.notable):
        lines.append(_t(f"  … {summary.notable_total - len(summary.notable)} more", "dim"))
    return Group(*lines)

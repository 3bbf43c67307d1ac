"""Helpers every renderer shares: cleaning untrusted text, number formatting,
verdict wording, event summaries and JSON-safe conversion."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncdoctor.doctor.model import Diagnosis, Event, LossShape, RankSummary

# Colour per verdict (the wording is model.VERDICT_TEXT); rich style names double as CSS class suffixes.
VERDICT_STYLE = {
    "healthy": "green",
    "sync_problem": "red",
    "not_sync_problem": "yellow",
    "inconclusive": "blue",
}
SHAPE_STYLE = {
    "decreasing": "green",
    "noise": "green",
    "flat": "yellow",
    "plateau_chance": "yellow",
    "spike": "yellow",
    "diverging": "red",
    "sawtooth": "red",
    "nonfinite": "red",
    "too_short": "blue",
}

# Terminal escape sequences a hostile log line may carry: CSI (colours, cursor
# moves, screen clears), OSC (window titles, hyperlinks, clipboard writes; ended by
# BEL or ST, or by nothing at all), DCS/SOS/PM/APC strings, and two-byte escapes.
# The 8-bit C1 forms (0x9b CSI, 0x9d OSC, ...) are covered by the control-character
# pass that follows.
_ANSI = re.compile(
    r"""
    \x1b\[[0-?]*[ -/]*[@-~]                  # CSI
  | \x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)      # OSC
  | \x1b[PX^_][^\x1b]*(?:\x1b\\|$)           # DCS, SOS, PM, APC
  | \x1b[ -/]*[0-~]?                         # other escapes, or a lone ESC
    """,
    re.VERBOSE,
)
# C0 controls except tab/newline, DEL, C1 controls, and the bidi overrides and
# isolates that can make a line read differently from what it is ("Trojan Source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text: object, oneline: bool = False, limit: int | None = None) -> str:
    """Untrusted text (log lines, paths, tensor names) made inert for display.

    Removes terminal escape sequences and control characters; ``oneline`` folds
    line breaks into " ⏎ " for table cells; ``limit`` truncates with an ellipsis.
    The result still needs markup escaping by the renderer (HTML / rich).
    """
    s = "" if text is None else str(text)
    s = s.replace("\r\n", "\n").replace("\r", "\n")
    s = _CONTROL.sub("", _ANSI.sub("", s))
    if oneline:
        s = " ⏎ ".join(part.strip() for part in s.split("\n") if part.strip())
    if limit is not None and len(s) > limit:
        s = s[: max(limit - 1, 0)] + "…"
    return s


def fmt_num(x: float | int | None, digits: int = 4) -> str:
    """A number for people: None → '—', NaN/inf spelled out, floats to ``digits`` significant."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    xf = float(x)
    if math.isnan(xf):
        return "nan"
    if math.isinf(xf):
        return "inf" if xf > 0 else "-inf"
    return f"{xf:.{digits}g}"


def bracket_text(diag: Diagnosis) -> str:
    """'between step 41 and 50' — where the replicas parted, as closely as the checks tell."""
    div = diag.divergence_step
    if div is None:
        return ""
    last = diag.last_agree_step
    if last is None:
        return f"at or before step {div} (no earlier check agreed)"
    if last + 1 >= div:
        return f"at step {div}"
    return f"between step {last + 1} and {div}"


def shape_line(shape: LossShape) -> str:
    """'sawtooth (rank 3, 10 points)' — the heading for a loss shape."""
    who = "all-rank mean" if shape.rank is None else f"rank {shape.rank}"
    return f"{shape.shape} ({who}, {shape.n_points} points)"


@dataclass
class EventSummary:
    counts: list[tuple[str, int, int]]  # (kind, total, benign), most frequent first
    notable: list[Event]  # the first non-benign events, in input order
    notable_total: int


def summarize_events(events: list[Event], limit: int = 10) -> EventSummary:
    total: Counter[str] = Counter()
    benign: Counter[str] = Counter()
    for e in events:
        total[e.kind] += 1
        benign[e.kind] += bool(e.benign)
    notable = [e for e in events if not e.benign]
    counts = [(k, n, benign[k]) for k, n in sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))]
    return EventSummary(counts, notable[:limit], len(notable))


def shapes_by_rank(diag: Diagnosis) -> dict[int, LossShape]:
    return {s.rank: s for s in diag.rank_shapes if s.rank is not None}


# Beyond this many ranks the per-rank tables list only the ranks that need attention,
# and one line (the envelope) for the others.
MAX_RANK_ROWS = 32


def needs_attention(r: RankSummary, shapes: dict[int, LossShape]) -> bool:
    shape = shapes.get(r.rank)
    return (
        r.status not in ("ok", "") or bool(r.note) or (shape is not None and shape.shape not in ("decreasing", "noise"))
    )


def envelope(rows: list[RankSummary]) -> str:
    """The ordinary ranks in one line: the range of each column (and its median)."""
    parts = []
    for label, values in (
        ("steps", [r.steps for r in rows]),
        ("last loss", [r.last_loss for r in rows]),
        ("mean loss", [r.mean_loss for r in rows]),
        ("grad norm", [r.grad_norm for r in rows]),
    ):
        seen = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
        if not seen:
            continue
        lo, hi, mid = seen[0], seen[-1], seen[len(seen) // 2]
        if label == "steps":
            parts.append(f"steps {int(lo)}" if lo == hi else f"steps {int(lo)}–{int(hi)}")
        elif fmt_num(lo) == fmt_num(hi):
            parts.append(f"{label} {fmt_num(lo)}")
        else:
            parts.append(f"{label} {fmt_num(lo)}–{fmt_num(hi)} (median {fmt_num(mid)})")
    return "; ".join(parts)


# --- JSON --------------------------------------------------------------------------------------


def json_safe(obj: Any) -> Any:
    """A copy of ``obj`` that strict JSON accepts: NaN/±inf become null.

    Lists of numbers (the big loss/grad-norm series) are checked with numpy so a
    256-rank × 10k-step diagnosis does not walk 5M floats in Python when they are
    all finite.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if obj and _all_numbers(obj):
            try:
                arr = np.asarray(obj, dtype=float)
            except (TypeError, ValueError, OverflowError):
                arr = None
            if arr is not None and np.isfinite(arr).all():
                return list(obj)
        return [json_safe(v) for v in obj]
    return obj


def _all_numbers(seq: list | tuple) -> bool:
    """True for a flat list of numbers or a list of equal-length number lists."""
    first = seq[0]
    if isinstance(first, (list, tuple)):
        return bool(first) and isinstance(first[0], (int, float)) and not isinstance(first[0], bool)
    return isinstance(first, (int, float)) and not isinstance(first, bool)

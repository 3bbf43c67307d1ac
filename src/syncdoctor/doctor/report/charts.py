"""Static SVG charts for the HTML report, drawn here in Python: no JavaScript, no
plotting bundle, so the report stays small (tens of kB), opens anywhere (a browser
with scripts off, a Jupyter output cell, a mail attachment) and its Content Security
Policy can forbid every script.

Every chart is sized for 5 to 100,000 steps and 1 to 1,024 ranks:

- lines are reduced to at most two points per pixel column, keeping each column's
  minimum and maximum (a one-step spike stays visible);
- beyond ``MAX_LINES`` ranks the loss becomes the min-max envelope over all ranks
  with the median rank's curve, plus the ranks the evidence singles out;
- rank × step grids (the agreement timeline, the per-rank gradient norms) are
  rasterised to one pixel per column and at most ``MAX_ROWS`` rows, embedded as a
  PNG, with rank bins that keep the worst (agreement) or the largest (norm) value.

Numbers only reach the SVG as formatted coordinates; every text is escaped.
"""

from __future__ import annotations

import base64
import math
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

import numpy as np

WIDTH, HEIGHT = 960, 300  # the SVG's user units; it scales to the page width
LEFT, RIGHT, TOP, BOTTOM = 64, 34, 26, 40
PLOT_W = WIDTH - LEFT - RIGHT
MAX_LINES = 16  # per-rank lines up to this many ranks; an envelope beyond
MAX_HIGHLIGHT = 8  # ranks drawn on top of the envelope
MAX_ROWS = 256  # rows of a rank × step grid
MARKER_POINTS = 60  # a series this short also gets a dot per point
CLIP = 1e300

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
# Agreement states, worst last: a rank bin shows the worst state of its ranks.
NO_CHECK, AGREED, MISSING, PARTED = 0, 1, 2, 3
STATE_RGB = {NO_CHECK: (255, 255, 255), AGREED: (76, 175, 80), MISSING: (176, 182, 192), PARTED: (211, 47, 47)}
# Viridis at nine stops, interpolated.
_VIRIDIS = np.array(
    [
        (68, 1, 84),
        (71, 44, 122),
        (59, 81, 139),
        (44, 113, 142),
        (33, 144, 141),
        (39, 173, 129),
        (92, 200, 99),
        (170, 220, 50),
        (253, 231, 37),
    ],
    float,
)


def coord(x: float) -> str:
    """An SVG coordinate: one decimal at most, non-finite as 0."""
    return f"{x:.1f}".rstrip("0").rstrip(".") if math.isfinite(x) else "0"


@dataclass
class Scale:
    lo: float
    hi: float
    p0: float  # pixel of lo
    p1: float  # pixel of hi
    log: bool = False

    def __post_init__(self) -> None:
        if self.log:
            self.lo, self.hi = math.log10(self.lo), math.log10(self.hi)
        if not self.hi > self.lo:
            pad = abs(self.lo) * 0.05 or 0.5
            self.lo, self.hi = self.lo - pad, self.hi + pad

    def px(self, v: np.ndarray | float) -> np.ndarray:
        a = np.asarray(v, dtype=float)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                a = np.log10(np.where(a > 0, a, np.nan))
        return self.p0 + (a - self.lo) / (self.hi - self.lo) * (self.p1 - self.p0)

    def ticks(self, integer: bool = False, n: int = 6) -> list[tuple[float, str]]:
        if self.log:
            first, last = math.floor(self.lo), math.ceil(self.hi)
            every = max(1, math.ceil((last - first) / n))
            return [
                (10.0**e, _fmt_tick(10.0**e))
                for e in range(first, last + 1, every)
                if self.lo - 1e-9 <= e <= self.hi + 1e-9
            ]
        span = self.hi - self.lo
        raw = span / n
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        if integer:
            step = max(1, round(step))
        start = math.ceil(self.lo / step) * step
        out: list[tuple[float, str]] = []
        v = start
        while v <= self.hi + step * 1e-9 and len(out) < 20:
            out.append((v, _fmt_tick(v, integer)))
            v += step
        return out


def _fmt_tick(v: float, integer: bool = False) -> str:
    if integer:
        return f"{int(round(v)):,}"
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
    return f"{v:.4g}"


def step_domain(series: Iterable[np.ndarray], extra: Iterable[int | None] = ()) -> tuple[float, float]:
    """The step range every chart shares: from the first to the last step anything saw."""
    lo, hi = math.inf, -math.inf
    for steps in series:
        if steps.size:
            lo, hi = min(lo, float(steps.min())), max(hi, float(steps.max()))
    for s in extra:
        if s is not None:
            lo, hi = min(lo, float(s)), max(hi, float(s))
    if lo > hi:
        return 0.0, 1.0
    if lo == hi:
        return lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.015  # points at the first and last step stay off the frame
    return lo - pad, hi + pad


def value_scale(arrays: Sequence[np.ndarray], p0: float, p1: float, log_ratio: float = 1e3) -> Scale:
    """A y scale over the finite values (clipped to ±1e300); log when all are
    positive and they span more than ``log_ratio``."""
    finite = [np.clip(a[np.isfinite(a)], -CLIP, CLIP) for a in arrays]
    finite = [a for a in finite if a.size]
    if not finite:
        return Scale(0.0, 1.0, p0, p1)
    lo = min(float(a.min()) for a in finite)
    hi = max(float(a.max()) for a in finite)
    positive = [a[a > 0] for a in finite]
    low_positive = min((float(a.min()) for a in positive if a.size), default=0.0)
    # Zeros may sit on a log axis (they are left out, as gaps); negatives may not.
    if lo >= 0 and low_positive > 0 and hi / low_positive > log_ratio:
        return Scale(low_positive, hi, p0, p1, log=True)
    pad = max((hi - lo) * 0.06, abs(hi) * 0.02)
    return Scale(lo - pad if lo - pad > 0 or lo < 0 else 0.0, hi + pad, p0, p1)


def finite_clipped(values: np.ndarray) -> np.ndarray:
    """Values to plot: ±1e300 at most (axis maths stays finite), NaN/inf as gaps."""
    v = np.asarray(values, dtype=float)
    return np.where(np.isfinite(v), np.clip(v, -CLIP, CLIP), np.nan)


def polyline_path(xs: np.ndarray, ys: np.ndarray) -> str:
    """An SVG path through the points, broken where a value is missing."""
    ok = np.isfinite(xs) & np.isfinite(ys)
    # A point far off the chart (a value beyond the axis) is pinned just outside it.
    xs = np.clip(xs, -WIDTH, 2 * WIDTH)
    ys = np.clip(ys, -HEIGHT * 4, HEIGHT * 5)
    parts: list[str] = []
    pen_down = False
    for x, y, good in zip(xs.tolist(), ys.tolist(), ok.tolist(), strict=True):
        if not good:
            pen_down = False
            continue
        parts.append(("L" if pen_down else "M") + f"{x:.1f} {y:.1f}")
        pen_down = True
    return "".join(parts)


def band_path(xs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> str:
    """A filled band between two curves (columns without a value are skipped)."""
    ok = np.isfinite(lo) & np.isfinite(hi)
    out = []
    start = None
    for i in range(len(xs) + 1):
        good = i < len(xs) and ok[i]
        if good and start is None:
            start = i
        if not good and start is not None:
            seg = slice(start, i)
            top = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs[seg], hi[seg], strict=True))
            bottom = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs[seg][::-1], lo[seg][::-1], strict=True))
            if i - start == 1:  # one column: a thin vertical bar
                x = xs[start]
                top = f"{x - 0.5:.1f},{hi[start]:.1f} {x + 0.5:.1f},{hi[start]:.1f}"
                bottom = f"{x + 0.5:.1f},{lo[start]:.1f} {x - 0.5:.1f},{lo[start]:.1f}"
            out.append(f"M{top} L{bottom}Z")
            start = None
    return "".join(out)


def svg_open(height: int = HEIGHT, label: str = "") -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    )


def x_axis(scale: Scale, y: float, title: str = "step") -> str:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{coord(y)}" x2="{WIDTH - RIGHT}" y2="{coord(y)}"/>']
    for v, label in scale.ticks(integer=True):
        x = float(scale.px(v))
        parts.append(
            f'<line class="tick" x1="{coord(x)}" y1="{coord(y)}" x2="{coord(x)}" y2="{coord(y + 4)}"/>'
            f'<text class="tl" x="{coord(x)}" y="{coord(y + 16)}" text-anchor="{_anchor(x)}">{escape(label)}</text>'
        )
    parts.append(
        f'<text class="at" x="{LEFT + PLOT_W / 2:.0f}" y="{coord(y + 33)}" text-anchor="middle">{escape(title)}</text>'
    )
    return "".join(parts)


def _anchor(x: float) -> str:
    """Tick labels at the plot's ends stay inside the picture."""
    return "end" if x > WIDTH - RIGHT - 20 else ("start" if x < LEFT + 10 else "middle")


def y_axis(scale: Scale, title: str, grid: bool = True) -> str:
    parts = []
    for v, label in scale.ticks():
        y = float(scale.px(v))
        if grid:
            parts.append(f'<line class="grid" x1="{LEFT}" y1="{coord(y)}" x2="{WIDTH - RIGHT}" y2="{coord(y)}"/>')
        parts.append(f'<text class="tl" x="{LEFT - 6}" y="{coord(y + 4)}" text-anchor="end">{escape(label)}</text>')
    mid = (scale.p0 + scale.p1) / 2
    parts.append(
        f'<text class="at" transform="translate(14 {coord(mid)}) rotate(-90)" text-anchor="middle">{escape(title)}</text>'
    )
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{coord(scale.p1)}" x2="{LEFT}" y2="{coord(scale.p0)}"/>')
    return "".join(parts)


def png_data_uri(rgb: np.ndarray) -> str:
    """A (rows, cols, 3) uint8 array as a PNG data URI (no imaging library needed)."""
    rows, cols, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[r].tobytes() for r in range(rows))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", cols, rows, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def raster(rgb: np.ndarray, x: float, y: float, w: float, h: float) -> str:
    return (
        f'<image x="{coord(x)}" y="{coord(y)}" width="{coord(w)}" height="{coord(h)}" preserveAspectRatio="none" '
        f'style="image-rendering:pixelated" href="{png_data_uri(rgb)}"/>'
    )


def viridis(t: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (NaN: white) → uint8 RGB."""
    t = np.asarray(t, float)
    pos = np.clip(np.nan_to_num(t, nan=0.0), 0, 1) * (len(_VIRIDIS) - 1)
    i = np.minimum(pos.astype(int), len(_VIRIDIS) - 2)
    frac = (pos - i)[..., None]
    rgb = _VIRIDIS[i] * (1 - frac) + _VIRIDIS[i + 1] * frac
    rgb[~np.isfinite(t)] = 255
    return rgb.round().astype(np.uint8)


def rank_bins(n_ranks: int) -> int:
    """Ranks per row of a rank × step grid."""
    return max(1, math.ceil(n_ranks / MAX_ROWS))


def columns_of(scale: Scale, steps: np.ndarray) -> np.ndarray:
    """Pixel column (0 .. PLOT_W-1) of each step."""
    return np.clip(np.floor(scale.px(steps) - LEFT), 0, PLOT_W - 1).astype(np.int64)


def rank_labels(ranks: Sequence[int], per_row: int, top: float, row_h: float) -> str:
    """Rank labels on the left of a grid, at most ~16 of them."""
    rows = math.ceil(len(ranks) / per_row)
    every = max(1, math.ceil(rows / 16))
    parts = []
    for row in range(0, rows, every):
        first = ranks[row * per_row]
        last = ranks[min(len(ranks), (row + 1) * per_row) - 1]
        label = str(first) if first == last else f"{first}-{last}"
        y = top + (row + 0.5) * row_h
        parts.append(f'<text class="tl" x="{LEFT - 6}" y="{coord(y + 4)}" text-anchor="end">{label}</text>')
    return "".join(parts)

"""A run against a baseline run: where the loss curves part, and whether the
difference is the parallel part.

The baseline is a single-card run of the same recipe, or an earlier healthy run.
Both are read the way ``diagnose PATH`` reads anything (probe run folders, raw
logs); each yields a loss curve: the mean over ranks per step, and one curve per
rank. docs/baseline.md explains every choice below; in short:

* **Alignment.** By step; when both runs' snapshots give a global batch and they
  differ, by samples seen (step × global batch), since a 2-card run at step s has
  seen what one card sees at step 2s. Which one was used is reported.
* **Noise band.** The curves are compared on rolling medians of ``w`` points (the
  window shape.py uses, ≈ n/10). The baseline's own step-to-step noise σ
  (1.4826·MAD of its moves / √2) gives the standard error of the difference of two
  such medians, 1.25·σ·√(2/w); the band is 4 of those. Two healthy runs also
  differ by their seeds and data order from the first step on: the gap over the
  first ``w`` compared points sets a floor. Positive losses are compared in log
  space, so a band means the same fraction of the level early and late.
* **Parting.** The first compared point from which the difference stays outside
  the band (on ≥ 80 % of the points from there to the end, at least 3 of them,
  starting with this one), on one side.
* **Verdict.** The shapes first (shape.py on each whole curve, and SD101's
  blow-up measure): both curves show the same kind of trouble (blow-up, stuck,
  jumps) → ``not_parallel_part``; both in trouble of different kinds →
  ``not_parallel_part`` unless the run parts above the baseline; only the run →
  ``parallel_part``; only the baseline → ``better``. Otherwise the parting
  decides: run higher → ``parallel_part``, lower → ``better``, none → ``agree``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from syncdoctor.doctor.model import (
    BASELINE_VERDICT_TEXT,
    BaselineComparison,
    BaselineVerdict,
    LossShape,
    RankParting,
)
from syncdoctor.doctor.rules._thresholds import BLOW_UP
from syncdoctor.doctor.series import downsample

if TYPE_CHECKING:
    from syncdoctor.doctor.evidence import Evidence

# The kinds of trouble a loss shape names (shape.py); shapes not listed are fine.
PROBLEM = {
    "diverging": "blow-up",
    "nonfinite": "blow-up",
    "plateau_chance": "stuck",
    "flat": "stuck",
    "sawtooth": "jumps",
}
BAND_SE = 4.0  # standard errors: over ~100 compared points, noise alone crosses 4 SE almost never
PERSIST = 0.8  # share of the points from the parting on that must stay outside the band
MIN_PERSIST_POINTS = 3  # and at least one window: a parting in the last few points is the median's edge
# A gap that holds: w-point medians w apart are independent, so SUSTAINED_WINDOWS of them
# in a row each beyond SUSTAINED_SE standard errors (p ≈ 0.023 each) is as unlikely under
# noise alone as one point beyond 4 SE, and it catches a steady offset that sits near the band.
SUSTAINED_SE = 2.0
SUSTAINED_WINDOWS = 3
MIN_OVERLAP = 5  # points, as shape.py needs to read a shape
SERIES_POINTS = 2000
MAX_RANKS_COMPARED = 64  # one rolling median per rank: 64 ranks × 20,000 steps took 5 s on a busy 2-core machine


@dataclass
class _Curve:
    steps: np.ndarray  # int steps, sorted
    mean: np.ndarray  # mean loss over ranks at each step
    per_rank: dict[int, tuple[np.ndarray, np.ndarray]]
    shape: LossShape | None
    rank_shapes: list[LossShape]
    world_size: int | None
    global_batch: int | None


def _global_batch(ev: Evidence) -> int | None:
    for snap in ev.snapshots.values():
        gb = snap.get("global_batch")
        if isinstance(gb, int) and gb > 0:
            return gb
        loader, world = snap.get("loader") or {}, snap.get("world_size")
        bs = loader.get("batch_size") if isinstance(loader, dict) else None
        if isinstance(bs, int) and bs > 0 and isinstance(world, int) and world > 0:
            return bs * world
    return None


def _curve(ev: Evidence) -> _Curve:
    losses = ev.losses
    mean = losses.group_by("step").agg(pl.col("loss").mean()).sort("step")
    per_rank = {}
    for (rank,), part in losses.sort("rank", "step").group_by("rank", maintain_order=True):
        per_rank[int(rank)] = (part["step"].to_numpy().astype(np.int64), part["loss"].cast(pl.Float64).to_numpy())
    return _Curve(
        steps=mean["step"].to_numpy().astype(np.int64),
        mean=mean["loss"].cast(pl.Float64).to_numpy(),
        per_rank=per_rank,
        shape=ev.loss.mean_shape,
        rank_shapes=ev.loss.rank_shapes,
        world_size=ev.world_size,
        global_batch=_global_batch(ev),
    )


def _problem(curve: _Curve) -> tuple[str | None, str]:
    """(kind of trouble, why) for a curve: the mean curve's shape (shape.py), a rank's
    non-finite loss, or a blow-up the loss never came back from (SD101's measure: the
    peak 5× the start, the last quarter still above half the start; healthy
    training never reaches that, and a run that blew up then got stuck is not a
    'spike' however the shape reads)."""
    nonfinite = [s.rank for s in curve.rank_shapes if s.shape == "nonfinite"]
    if nonfinite:
        return "blow-up", f"non-finite loss on rank(s) {nonfinite[:8]}"
    y = curve.mean[np.isfinite(curve.mean)]
    if y.size >= 10:
        start, peak = float(np.min(y[:3])), float(np.max(y))
        tail = float(np.median(y[-max(6, y.size // 4) :]))
        if start > 0 and peak > BLOW_UP * start and tail > 0.5 * start:
            return "blow-up", (
                f"the loss blew up from {start:.3g} to {peak:.3g} and stayed at {tail:.3g} (last quarter), "
                "never back to learning"
            )
    if curve.shape is not None and curve.shape.shape in PROBLEM:
        return PROBLEM[curve.shape.shape], f"loss shape {curve.shape.shape}"
    return None, ""


def _rolling_median(y: np.ndarray, window: int) -> np.ndarray:
    half = window // 2
    if y.size <= half:
        return y.copy()
    padded = np.pad(y, half, mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, window), axis=1)


def _smooth(z: np.ndarray, window: int) -> np.ndarray:
    """The rolling median of the finite prefix; +inf from the first non-finite loss on
    (the run is out of any band from there, and a NaN must not pull the median early)."""
    bad = ~np.isfinite(z)
    first = int(np.argmax(bad)) if bad.any() else z.size
    out = np.full(z.size, np.inf)
    if first:
        out[:first] = _rolling_median(z[:first], window)
    return out


def _window(n: int) -> int:
    w = min(51, max(3, n // 10))
    return w + 1 - w % 2


@dataclass
class _Band:
    scale: str
    window: int
    sigma: float
    early_gap: float
    half_width: float


def _parting(diff: np.ndarray, band: float, window: int) -> tuple[int, str] | None:
    """(index, direction) of the first point from which ``diff`` stays beyond ``band``
    on one side: this point and ≥ PERSIST of the rest, at least MIN_PERSIST_POINTS and
    at least ``window`` points (one independent median)."""
    best: tuple[int, str] | None = None
    n = diff.size
    for sign, direction in ((1.0, "worse"), (-1.0, "better")):
        out = np.nan_to_num(sign * diff, nan=np.inf) > band  # a non-finite run loss is out
        after = np.cumsum(out[::-1])[::-1]  # points outside from i to the end
        remaining = np.arange(n, 0, -1)
        ok = out & (after >= PERSIST * remaining) & (remaining >= max(MIN_PERSIST_POINTS, window))
        if ok.any():
            i = int(np.argmax(ok))
            if best is None or i < best[0]:
                best = (i, direction)
    return best


def _sustained_parting(diff: np.ndarray, band: float, window: int) -> tuple[int, str] | None:
    """(index, direction) where a steady gap begins: the smoothed ``diff`` read every
    ``window`` points (independent medians), beyond ``band`` at each of those reads
    from there to the end, at least SUSTAINED_WINDOWS of them; None if there is none."""
    reads = np.arange(diff.size - 1, -1, -window)[::-1]  # ends on the last point
    if reads.size < SUSTAINED_WINDOWS:
        return None
    d = np.nan_to_num(diff[reads], nan=np.inf)
    for sign, direction in ((1.0, "worse"), (-1.0, "better")):
        out = sign * d > band
        if not out[-SUSTAINED_WINDOWS:].all():
            continue
        k = reads.size - int(np.argmin(out[::-1])) if not out.all() else 0  # the first read of the last run
        return int(reads[k]), direction
    return None


def compare(run: Evidence, baseline: Evidence, baseline_path: str = "") -> BaselineComparison:
    """Compare ``run`` with ``baseline`` (see the module docstring)."""
    a, b = _curve(run), _curve(baseline)
    by_samples = bool(a.global_batch and b.global_batch and a.global_batch != b.global_batch)
    # baseline step → run step (by_samples: both batches are known)
    ratio = (b.global_batch / a.global_batch) if by_samples and a.global_batch and b.global_batch else 1.0
    (run_problem, run_why), (base_problem, base_why) = _problem(a), _problem(b)
    out = BaselineComparison(
        path=baseline_path,
        verdict="inconclusive",
        summary="",
        aligned_by="samples" if by_samples else "step",
        run_world_size=a.world_size,
        baseline_world_size=b.world_size,
        run_global_batch=a.global_batch,
        baseline_global_batch=b.global_batch,
        run_shape=a.shape,
        baseline_shape=b.shape,
        run_problem=run_problem,
        baseline_problem=base_problem,
    )
    base_x = b.steps * ratio  # the baseline on the run's step axis
    out.series = {
        "run": _pairs(a.steps.astype(float), a.mean),
        "baseline": _pairs(base_x, b.mean),
    }
    evidence = out.evidence
    evidence.append(_alignment_line(a, b, by_samples))
    evidence.append(f"this run's loss shape: {_shape_text(a.shape)}")
    evidence.append(f"the baseline's loss shape: {_shape_text(b.shape)}")
    for who, problem, why in (("this run", run_problem, run_why), ("the baseline", base_problem, base_why)):
        if problem:
            evidence.append(f"{who} is in trouble ({problem}): {why}")

    # The compared points: the run's steps inside the baseline's span.
    if a.steps.size and b.steps.size:
        lo, hi = max(a.steps.min(), base_x.min()), min(a.steps.max(), base_x.max())
        inside = (a.steps >= lo) & (a.steps <= hi)
    else:
        inside = np.zeros(a.steps.size, bool)
    x = a.steps[inside]
    band = None
    if x.size >= MIN_OVERLAP and np.isfinite(b.mean).sum() >= MIN_OVERLAP:
        band = _measure(out, a, b, base_x, inside, ratio)
    elif a.steps.size and b.steps.size:
        evidence.append(f"only {x.size} of this run's steps fall inside the baseline's span: too few to compare")

    out.verdict = _verdict(out, run_problem, base_problem, band is not None)
    out.summary = _summary(out)
    return out


def _measure(
    out: BaselineComparison, a: _Curve, b: _Curve, base_x: np.ndarray, inside: np.ndarray, ratio: float
) -> _Band:
    x = a.steps[inside]
    run_y = a.mean[inside]
    # The baseline at the run's points: its rolling median interpolated, so the
    # baseline's own noise is smoothed as much as the run's.
    finite_b = np.isfinite(b.mean)
    positive = bool(np.all(a.mean[np.isfinite(a.mean)] > 0) and np.all(b.mean[finite_b] > 0))
    scale = "log" if positive else "linear"

    def tr(y: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(y) if positive else y

    window = _window(x.size)
    zb_all = tr(b.mean[finite_b])
    zb_smooth = _rolling_median(zb_all, _window(zb_all.size))
    zb = np.interp(x, base_x[finite_b], zb_smooth)
    # Past a baseline NaN the baseline has no value: those points count as not comparable.
    first_bad_b = base_x[~finite_b].min() if (~finite_b).any() else np.inf
    zb = np.where(x >= first_bad_b, np.nan, zb)
    za_raw = tr(run_y)
    za = _smooth(za_raw, window)
    diff = za - zb
    moves = np.diff(zb_all)
    sigma = 1.4826 * float(np.median(np.abs(moves))) / math.sqrt(2.0) if moves.size else 0.0
    se = 1.25 * sigma * math.sqrt(2.0 / window)
    early = diff[:window]
    early = early[np.isfinite(early)]
    early_gap = float(np.max(np.abs(early))) if early.size else 0.0
    half_width = max(BAND_SE * se, 1e-12)
    band = _Band(scale, window, sigma, early_gap, half_width)
    out.scale, out.window = scale, window
    out.noise_band, out.baseline_noise, out.early_gap = _r(half_width), _r(sigma), _r(early_gap)
    out.compared_steps = [int(x[0]), int(x[-1])]
    out.compared_points = int(x.size)

    def back(z: float) -> float | None:
        if not math.isfinite(z):
            return None
        return _r(math.exp(z) if positive else z)

    comparable = np.isfinite(zb)
    compared_diff = np.where(comparable, diff, 0.0)
    parting = _parting(compared_diff, half_width, window)
    sustained = False
    if parting is None:
        parting = _sustained_parting(compared_diff, SUSTAINED_SE * se, window)
        sustained = parting is not None
    last = int(np.flatnonzero(comparable)[-1]) if comparable.any() else x.size - 1
    out.run_loss_at_end, out.baseline_loss_at_end = back(float(za[last])), back(float(zb[last]))
    width = f"×/÷ {math.exp(half_width):.3g}" if positive else f"± {half_width:.3g}"
    out.evidence.append(
        f"noise band {width} around the baseline ({'log' if positive else 'linear'} scale; "
        f"4 standard errors of the difference of two {window}-point medians, from the baseline's "
        f"step-to-step noise {sigma:.3g}; the gap over the first {window} compared points was "
        f"{early_gap:.3g}); {x.size} points compared, steps {x[0]}–{x[-1]}"
    )
    if parting is not None:
        i, direction = parting
        out.parted_at_step = int(x[i])
        out.parted_at_baseline_step = int(round(x[i] / ratio))
        out.direction = direction
        out.run_loss_at_parting, out.baseline_loss_at_parting = back(float(za[i])), back(float(zb[i]))
        where = f"step {out.parted_at_step}" + (
            f" (baseline step {out.parted_at_baseline_step})"
            if out.parted_at_baseline_step != out.parted_at_step
            else ""
        )
        out.evidence.append(
            f"the curves part at {where}: this run {_num(out.run_loss_at_parting)} vs the baseline "
            f"{_num(out.baseline_loss_at_parting)} (smoothed), {'higher' if direction == 'worse' else 'lower'} "
            f"from there on; at the last compared step {x[last]}: {_num(out.run_loss_at_end)} vs "
            f"{_num(out.baseline_loss_at_end)}"
            + (
                f" (a steady gap: every {window}-point median from there on lies beyond "
                f"{SUSTAINED_SE:g} standard errors, {math.exp(SUSTAINED_SE * se) if positive else SUSTAINED_SE * se:.3g}"
                f"{'×' if positive else ''}, though within the band)"
                if sustained
                else ""
            )
        )
    else:
        out.evidence.append(
            f"the curves stay within the band: at the last compared step {x[last]}, this run "
            f"{_num(out.run_loss_at_end)} vs the baseline {_num(out.baseline_loss_at_end)} (smoothed)"
        )
    # Per rank, against the same band: a rank that parts alone is a per-rank offset.
    if len(a.per_rank) > 1:
        shapes = {s.rank: s.shape for s in a.rank_shapes}
        if len(a.per_rank) > MAX_RANKS_COMPARED:
            out.evidence.append(
                f"per rank: only the first {MAX_RANKS_COMPARED} of {len(a.per_rank)} ranks are compared "
                "with the baseline (the mean curve covers them all)"
            )
        for rank, (steps, values) in list(a.per_rank.items())[:MAX_RANKS_COMPARED]:
            keep = (steps >= x[0]) & (steps <= x[-1])
            rx, rz_raw = steps[keep], tr(values[keep])
            if rx.size < MIN_OVERLAP:
                continue
            rank_window = _window(rx.size)
            rz = _smooth(rz_raw, rank_window)
            rzb = np.interp(rx, x[comparable], zb[comparable]) if comparable.any() else np.full(rx.size, np.nan)
            p = _parting(np.where(np.isfinite(rzb), rz - rzb, 0.0), half_width, rank_window)
            out.ranks.append(RankParting(rank, int(rx[p[0]]) if p else None, p[1] if p else None, shapes.get(rank, "")))
        parted = [r for r in out.ranks if r.parted_at_step is not None]
        if parted and len(parted) < len(out.ranks):
            out.evidence.append(
                "per rank: "
                + ", ".join(f"rank {r.rank} parts at step {r.parted_at_step} ({r.direction})" for r in parted[:8])
                + f"; {len(out.ranks) - len(parted)} rank(s) stay with the baseline — a per-rank offset"
            )
    return band


def _verdict(
    out: BaselineComparison, run_problem: str | None, base_problem: str | None, measured: bool
) -> BaselineVerdict:
    if run_problem and base_problem:
        if run_problem == base_problem:
            return "not_parallel_part"
        out.evidence.append(
            f"both curves are in trouble but not the same kind (this run {run_problem}, the baseline "
            f"{base_problem}): what decides is whether this run is worse than the baseline"
        )
        if out.direction != "worse":
            return "not_parallel_part"  # the baseline goes wrong too and this run is no worse
        return "parallel_part"
    elif run_problem:
        return "parallel_part"
    elif base_problem and out.direction != "worse":
        return "better"  # (a run that climbs above a troubled baseline is still the worse one)
    if not measured:
        return "inconclusive"
    if out.direction == "worse":
        return "parallel_part"
    if any(r.direction == "worse" for r in out.ranks):
        return "parallel_part"  # some ranks run above the baseline while the mean does not: per-rank offsets
    if out.direction == "better":
        return "better"
    return "agree"


def _summary(out: BaselineComparison) -> str:
    text = BASELINE_VERDICT_TEXT[out.verdict]
    rs, bs = (s.shape if s else "no curve" for s in (out.run_shape, out.baseline_shape))
    if out.verdict == "not_parallel_part":
        return f"{text} ({out.run_problem}: this run {rs}, the baseline {bs})"
    where = f", parting at step {out.parted_at_step}" if out.parted_at_step is not None else ""
    return f"{text} (this run {rs}, the baseline {bs}{where}; aligned by {out.aligned_by})"


def _alignment_line(a: _Curve, b: _Curve, by_samples: bool) -> str:
    def run_text(c: _Curve) -> str:
        parts = [f"{c.world_size} rank(s)" if c.world_size else "ranks unknown"]
        parts.append(f"global batch {c.global_batch}" if c.global_batch else "global batch unknown")
        return ", ".join(parts)

    if by_samples:
        how = (
            f"aligned by samples seen (the global batches differ): baseline step s is this run's "
            f"step s × {b.global_batch}/{a.global_batch}"
        )
    elif a.global_batch and b.global_batch:
        how = "aligned by step (the same global batch)"
    else:
        how = "aligned by step (a global batch is unknown, so samples seen cannot be used)"
    return f"{how}; this run: {run_text(a)}; baseline: {run_text(b)}"


def _shape_text(shape: LossShape | None) -> str:
    return "no loss curve" if shape is None else f"{shape.shape} — {shape.detail}"


def _pairs(x: np.ndarray, y: np.ndarray) -> list[list[float]]:
    xs, ys = downsample(x, y, SERIES_POINTS)
    return np.column_stack([xs, ys]).tolist() if xs.size else []


def _r(x: float) -> float:
    return float(f"{x:.4g}")


def _num(x: float | None) -> str:
    return "non-finite" if x is None else f"{x:.4g}"

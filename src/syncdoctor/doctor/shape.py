"""Classify the shape of a loss curve (playbook §1.1: read the shape before anything else).

The playbook names three bad shapes: small noise (ignore it), a monotonic rise
(divergence: learning rate, model, labels) and staged jumps / a sawtooth with no
clear monotone trend (the shape a broken gradient sync leaves). This module turns
a series of loss values into one of those words plus the numbers that decided it.

Decision rules, in order (the first that matches wins)
------------------------------------------------------
Let ``y`` be the values, ``level`` = median(|y|), ``d`` = the step-to-step
differences, and ``T`` a rolling median of ``y`` (window ≈ n/10, 3..51 points,
odd). ``T`` is the trend; ``e = (y - T) / T`` is the residual relative to the
local level, so SGD noise that shrinks with the loss stays comparable.

1. ``nonfinite``  a NaN or ±inf appears; the first such step is reported.
2. ``too_short``  fewer than 5 points.
3. ``flat``       max - min ≤ 0.1 % of the level (``plateau_chance`` instead
   when ``chance_loss`` is given and the end level is within 10 % of it).
4. ``sawtooth``   the level moves in stages: ≥ 2 persistent shifts up *and* ≥ 2
   down, each a ≥ 30 % jump after which the median of the next h points
   (h = window/2) differs from that of the previous h by ≥ 30 % and by ~4
   standard errors of such a difference (so big iid SGD jitter never counts).
   Checked before spikes because a short stage looks like a wide spike.
5. ``spike``      a few (≤ max(3, n/500)) upward excursions where the loss at
   least doubles against its trend (e ≥ max(1, 8·median|e|, 5·P90(e)); the
   P90 term keeps heavy-tailed mini-batch losses from counting), each short
   (≤ window/8 points) or a single one, then back to the trend. An excursion
   still running at the last point that triples the loss is a blow-up →
   ``diverging``; a smaller one is ignored (too early to tell). More or longer
   excursions are repeated jumps → ``sawtooth``.
6. The trend is *clear* when the first- and last-quarter levels (interquartile
   means) differ by ≥ 10 % of the first and by > 4 standard errors
   (≈ 1.25·1.48·MAD(y - T)/√quarter, times √2 for the difference).

   * clear downward trend → ``decreasing`` (healthy training: however large, the
     mini-batch jitter sits on the trend and is explained by it), unless the
     loss jumps up and stays up ≥ 2 times (persistent shifts as in 4) → ``sawtooth``.
   * clear upward trend → ``diverging`` (steady rise), unless it comes with
     large alternating jumps: direction flips on ≥ 20 % of steps and either
     ≥ 2 drops of ≥ 30 % on ≥ 10 % of steps or ≥ 1 such drop with amplitude
     ≥ 0.15, or ≥ 2 persistent downward shifts → ``sawtooth`` (the playbook's
     0.25, 0.34, 0.49, 0.28, … 1.56).
   * no clear trend → ``sawtooth`` when the jumps are large (amplitude ≥ 0.15,
     flips ≥ 30 %, ≥ 3 moves of ≥ 30 % with both directions present); else
     ``plateau_chance`` when the end level is within 10 % of ``chance_loss``;
     else ``noise``.

Reported numbers: ``amplitude`` = median|d| / level; ``rhythm`` = fraction of
consecutive non-zero moves whose direction flips (iid noise ≈ 0.67, a steady
trend ≈ 0); ``trend`` = (last-quarter level - first-quarter level) /
|first-quarter level|. Cost is O(n·window), ~15 ms for 10,000 points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl
from numpy.lib.stride_tricks import sliding_window_view

from syncdoctor.doctor.model import LossShape

MIN_POINTS = 5
_FLAT_REL = 1e-3  # total range below 0.1 % of the level: nothing moves
_BIG_JUMP = 0.30  # a move of 30 % of the local level is a "large" jump
_BIG_AMPLITUDE = 0.15  # typical move of 15 % of the level: the curve is jumping, not jittering
_SAWTOOTH_RHYTHM = 0.30  # iid noise flips on ~2/3 of steps, a steady trend on ~0
_UPTREND_RHYTHM = 0.20
_COUNTER_FRACTION = 0.10  # counter-trend drops on at least this share of steps
_SPIKE_MIN_REL = 1.0  # a spike at least doubles the loss against its trend
_SPIKE_NOISE_MULT = 8.0
_SPIKE_TAIL_MULT = 5.0
_BLOWUP_FACTOR = 3.0  # an unrecovered jump at the last point must triple the loss to count
_SHIFT_SE_MULT = 10.0
_TREND_MIN_REL = 0.10
_TREND_SE_MULT = 4.0
_CHANCE_TOL = 0.10
_WINDOW_MAX = 51  # caps the rolling-median cost at n × 51 for long runs


@dataclass
class _Features:
    y: np.ndarray
    level: float
    amplitude: float
    rhythm: float
    trend: float
    first_q: float
    last_q: float
    window: int
    trend_curve: np.ndarray
    rel_resid: np.ndarray  # (y - T) / local level
    rel_moves: np.ndarray  # d / local level


# Finite losses near 1e308 overflow in the feature sums: the shape is still read
# (as inf amplitudes), without a RuntimeWarning per series on the user's terminal.
@np.errstate(over="ignore", invalid="ignore", divide="ignore")
def classify(
    values: Sequence[float] | np.ndarray,
    steps: Sequence[int] | None = None,
    rank: int | None = None,
    chance_loss: float | None = None,
) -> LossShape:
    """Return the :class:`LossShape` of one loss series (see the module docstring for the rules).

    ``steps`` (same length as ``values``) only changes how positions are reported;
    ``rank`` is copied into the result (None: the all-rank mean curve);
    ``chance_loss`` (e.g. ln(num_classes)) enables ``plateau_chance``.
    """
    y = np.asarray(values, dtype=float).ravel()
    n = int(y.size)
    if steps is not None and len(steps) != n:
        raise ValueError(f"steps has {len(steps)} entries but values has {n}")

    def at(i: int) -> int:
        return int(steps[i]) if steps is not None else i

    def result(shape: str, detail: str, f: _Features | None = None) -> LossShape:
        return LossShape(
            shape=shape,
            rank=rank,
            n_points=n,
            amplitude=_round(f.amplitude) if f else None,
            rhythm=_round(f.rhythm) if f else None,
            trend=_round(f.trend) if f else None,
            detail=detail,
        )

    bad = ~np.isfinite(y)
    if bad.any():
        i = int(np.argmax(bad))
        what = "NaN" if math.isnan(y[i]) else ("+inf" if y[i] > 0 else "-inf")
        return result(
            "nonfinite",
            f"Loss becomes {what} at step {at(i)} ({int(bad.sum())} of {n} values are not finite); "
            "everything after it is meaningless.",
        )
    if n < MIN_POINTS:
        return result("too_short", f"Only {n} point(s); at least {MIN_POINTS} are needed to read a shape.")

    f = _features(y)
    near_chance = chance_loss is not None and _near(f.last_q, chance_loss)
    chance_txt = f" near chance loss {_g(chance_loss)}" if chance_loss is not None else ""

    if float(y.max() - y.min()) <= _FLAT_REL * max(f.level, 1e-12):
        if near_chance:
            return result(
                "plateau_chance",
                f"Loss is flat at {_g(f.level)}{chance_txt}: the model predicts no better than "
                "guessing and is not learning.",
                f,
            )
        return result(
            "flat",
            f"Loss stays at {_g(f.level)} (total range {_g(float(y.max() - y.min()))}); "
            "nothing changes — are gradients or the learning rate zero?",
            f,
        )

    up_shifts, down_shifts = _persistent_shifts(f)
    if up_shifts >= 2 and down_shifts >= 2:
        # Checked before spikes: a short stage looks like a wide spike to the trend.
        return result(
            "sawtooth",
            f"Loss moves in stages: {up_shifts} jumps up and {down_shifts} down of ≥30 % that "
            f"each hold for {max(3, f.window // 2)}+ steps (trend {_pct(f.trend, signed=True)} "
            "first→last quarter) — staged jumps, the sync-problem shape.",
            f,
        )

    spikes = _spike_clusters(f)
    if spikes and spikes[-1][1] == n - 1:
        a = spikes[-1][0]
        factor = 1.0 + float(f.rel_resid[a:].max())
        if factor >= _BLOWUP_FACTOR:
            return result(
                "diverging",
                f"Loss blows up at the end: {factor:.1f}× its trend from step {at(a)} on, with no recovery.",
                f,
            )
        spikes = spikes[:-1]  # a jump at the very end: too early to call it a spike
    if spikes:
        first_at, last_end = spikes[0][0], spikes[-1][1]
        factor = 1.0 + float(f.rel_resid[first_at : spikes[0][1] + 1].max())
        short = all(b - a + 1 <= max(2, f.window // 8) for a, b in spikes)
        if len(spikes) <= max(3, n // 500) and (short or len(spikes) == 1):
            more = f" and {len(spikes) - 1} more" if len(spikes) > 1 else ""
            return result(
                "spike",
                f"Isolated jump at step {at(first_at)}{more}: {factor:.1f}× the trend, then back "
                f"(trend {_pct(f.trend, signed=True)} first→last quarter) — one bad batch or a "
                "one-off communication retry, not a sustained problem.",
                f,
            )
        return result(
            "sawtooth",
            f"{len(spikes)} separate jumps to ≥2× the trend (first at step {at(first_at)}, last "
            f"ending at step {at(last_end)}); repeated jumps up and back are the sync-problem shape.",
            f,
        )

    big_up = int((f.rel_moves >= _BIG_JUMP).sum())
    big_down = int((f.rel_moves <= -_BIG_JUMP).sum())
    moves = max(n - 1, 1)
    numbers = (
        f"typical jump {_pct(f.amplitude)} of the level, direction flips on {_pct(f.rhythm)} "
        f"of steps, trend {_pct(f.trend, signed=True)} first→last quarter ({_g(f.first_q)} → {_g(f.last_q)})"
    )
    direction = _trend_direction(f)

    if direction < 0:
        if up_shifts >= 2:
            return result(
                "sawtooth",
                f"Loss falls overall but jumps up and stays up {up_shifts} times (≥30 % level "
                f"shifts against the trend); {numbers}.",
                f,
            )
        return result(
            "decreasing",
            f"Loss decreases: {numbers}; the jitter is explained by the downward trend.",
            f,
        )

    if direction > 0:
        alternating = f.rhythm >= _UPTREND_RHYTHM and (
            (big_down >= 2 and big_down / moves >= _COUNTER_FRACTION)
            or (big_down >= 1 and f.amplitude >= _BIG_AMPLITUDE)
        )
        if alternating or down_shifts >= 2:
            return result(
                "sawtooth",
                f"Loss rises with large alternating jumps: {big_down} drop(s) of ≥30 % against "
                f"the rising trend; {numbers} — staged jumps, the sync-problem shape.",
                f,
            )
        recovering = _recovering_from(y)
        if recovering is not None:
            peak, last = recovering
            return result(
                "spike",
                f"Loss jumped to {_g(float(y[peak]))} at step {at(peak)} and has been coming back since "
                f"({_g(last)} at the last step): a spike that is recovering, not a steady rise.",
                f,
            )
        return result(
            "diverging",
            f"Loss rises steadily: {numbers}; suspect learning rate, model or data first.",
            f,
        )

    jumping = (
        f.amplitude >= _BIG_AMPLITUDE
        and f.rhythm >= _SAWTOOTH_RHYTHM
        and big_up >= 1
        and big_down >= 1
        and big_up + big_down >= 3
    )
    if jumping:
        return result(
            "sawtooth",
            f"Loss jumps up and down without a clear trend: {numbers}; {big_up} up / "
            f"{big_down} down jumps of ≥30 % — the sync-problem shape.",
            f,
        )
    if near_chance:
        return result(
            "plateau_chance",
            f"Loss hovers at {_g(f.last_q)}{chance_txt} with no trend: {numbers}; the model is not learning.",
            f,
        )
    return result("noise", f"Small fluctuation around {_g(f.level)} with no trend: {numbers}.", f)


def classify_many(
    series: Mapping[int, Sequence[float] | Sequence[Sequence[float]] | np.ndarray],
    chance_loss: float | None = None,
) -> list[LossShape]:
    """Classify one series per rank, sorted by rank.

    Each value is either a flat sequence of losses or ``[[step, loss], ...]`` pairs
    (the shape of :attr:`Diagnosis.loss_series`).
    """
    out = []
    for rank in sorted(series):
        arr = np.asarray(series[rank], dtype=float)
        if arr.ndim == 2 and arr.shape[1] == 2:
            steps = arr[:, 0].astype(np.int64).tolist()
            out.append(classify(arr[:, 1], steps=steps, rank=rank, chance_loss=chance_loss))
        else:
            out.append(classify(arr.ravel(), rank=rank, chance_loss=chance_loss))
    return out


# --- features ---------------------------------------------------------------------------------


def _features(y: np.ndarray) -> _Features:
    n = y.size
    level = float(np.median(np.abs(y)))
    if level <= 0.0:
        level = float(np.max(np.abs(y))) or 1e-12
    d = np.diff(y)
    amplitude = float(np.median(np.abs(d))) / level

    signs = np.sign(d[d != 0])
    rhythm = float(np.mean(signs[1:] != signs[:-1])) if signs.size > 1 else 0.0

    q = max(1, n // 4)
    first_q, last_q = _iq_mean(y[:q]), _iq_mean(y[-q:])
    trend = (last_q - first_q) / max(abs(first_q), 1e-12)

    window = min(_WINDOW_MAX, max(3, n // 10))
    window += 1 - window % 2  # odd, so the median is centred on the point
    trend_curve = _rolling_median(y, window)
    # Floor the local level so a loss that decays towards 0 does not turn tiny
    # absolute jitter into huge relative jumps.
    local = np.maximum(np.abs(trend_curve), 0.05 * level)
    rel_resid = (y - trend_curve) / local
    rel_moves = d / np.maximum(0.5 * (np.abs(y[:-1]) + np.abs(y[1:])), 0.05 * level)
    return _Features(
        y,
        level,
        amplitude,
        rhythm,
        trend,
        first_q,
        last_q,
        window,
        trend_curve,
        rel_resid,
        rel_moves,
    )


def _iq_mean(x: np.ndarray) -> float:
    """Mean of the middle half: robust to outliers, and unlike the median it does not
    flip between the two levels of an alternating series with the parity of the count."""
    lo, hi = np.percentile(x, [25, 75])
    mid = x[(x >= lo) & (x <= hi)]
    return float(mid.mean()) if mid.size else float(np.median(x))


def _rolling_median(y: np.ndarray, window: int) -> np.ndarray:
    half = window // 2
    # Reflecting at the edges keeps a trend's slope there instead of flattening
    # it (edge padding would make the first/last residuals artificially zero).
    padded = np.pad(y, half, mode="reflect") if y.size > half else np.pad(y, half, mode="edge")
    return sliding_median(padded, window)


def sliding_median(x: np.ndarray, window: int) -> np.ndarray:
    """The median of every ``window`` consecutive values of ``x`` (``x.size - window + 1``
    of them). An odd window's median is one of its values, which polars' rolling median
    finds ten times faster than numpy's median of each window (3 ms for 4,000 points,
    257 curves at 256 ranks); an even one averages two, which the two libraries may round
    differently, and a NaN sorts differently in each, so numpy's stays for those."""
    if window % 2 and 0 < window <= x.size and np.isfinite(x).all():
        return pl.Series(x, dtype=pl.Float64).rolling_median(window).to_numpy()[window - 1 :]
    return np.median(sliding_window_view(x, window), axis=1)


def _trend_direction(f: _Features) -> int:
    """+1 / -1 for a clear rise / fall between the first and last quarter, else 0."""
    change = f.last_q - f.first_q
    q = max(1, f.y.size // 4)
    # 1.4826·MAD ≈ σ for Gaussian noise; the median of q points has SE ≈ 1.25·σ/√q.
    sigma = 1.4826 * float(np.median(np.abs(f.y - f.trend_curve)))
    se = 1.25 * sigma / math.sqrt(q)
    if abs(change) < _TREND_MIN_REL * max(abs(f.first_q), 1e-12) or abs(change) <= (
        _TREND_SE_MULT * math.sqrt(2.0) * se
    ):
        return 0
    return 1 if change > 0 else -1


def _spike_clusters(f: _Features) -> list[tuple[int, int]]:
    """Runs (start, end inclusive) of points far above the trend."""
    # Mini-batch loss is heavy-tailed (a few hard batches per thousand reach 2-3× the
    # trend), so the bar rises with the 90th percentile as well as the median.
    threshold = max(
        _SPIKE_MIN_REL,
        _SPIKE_NOISE_MULT * float(np.median(np.abs(f.rel_resid))),
        _SPIKE_TAIL_MULT * float(np.percentile(f.rel_resid, 90)),
    )
    return _runs(np.flatnonzero(f.rel_resid >= threshold))


def _persistent_shifts(f: _Features) -> tuple[int, int]:
    """Count level shifts: a ≥30 % jump after which the next h points stay at the new level.

    Compares the median of the h points before each move with the median of the h
    points after it; iid jitter reverts at once and so never shifts the medians.
    """
    n = f.y.size
    h = max(3, f.window // 2)
    if n < 2 * h + 1:
        return 0, 0
    med = sliding_median(f.y, h)  # med[i] = median(y[i : i + h])
    before = med[: n - 2 * h + 1]  # y[i-h+1 .. i] for the move after index i
    after = med[h:]  # y[i+1 .. i+h]
    local = np.maximum(np.minimum(np.abs(before), np.abs(after)), 0.05 * f.level)
    shift = (after - before) / local
    # The difference of two medians of h noisy points has SE ≈ 1.8·σ/√h (Gaussian)
    # to 2.5·σ/√h (flat-tailed jitter); over 10k positions a real level shift must
    # stand ~4 SE clear of that, or big SGD jitter fakes stages.
    # σ from step-to-step moves (/√2): unlike residuals from the trend, those stay
    # small when the level itself moves in stages.
    sigma = 1.4826 * float(np.median(np.abs(f.rel_moves))) / math.sqrt(2.0)
    need = max(_BIG_JUMP, _SHIFT_SE_MULT * sigma / math.sqrt(h))
    moves = f.rel_moves[h - 1 : h - 1 + shift.size]
    up = (shift >= need) & (moves >= _BIG_JUMP)
    down = (shift <= -need) & (moves <= -_BIG_JUMP)
    return len(_runs(np.flatnonzero(up))), len(_runs(np.flatnonzero(down)))


_RECOVER_FROM_PEAK = 0.85  # the last value at most 85 % of the peak ...
_RECOVER_FALLING = 0.6  # ... with the loss falling on most steps since the peak


def _recovering_from(y: np.ndarray) -> tuple[int, float] | None:
    """(peak index, last value) when an upward trend is one jump the loss has been
    coming back from since: at least two points after the peak, mostly falling,
    the last clearly below the peak. A steady rise never falls like that."""
    peak = int(np.argmax(y))
    after = y[peak:]
    if len(after) < 3 or after[-1] > _RECOVER_FROM_PEAK * after[0]:
        return None
    falling = float((np.diff(after) < 0).mean())
    return (peak, float(after[-1])) if falling >= _RECOVER_FALLING else None


def _runs(idx: np.ndarray) -> list[tuple[int, int]]:
    """Group sorted indices into runs of neighbours (a gap of one point still joins them)."""
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) > 2)
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]]))
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def _near(value: float, chance: float) -> bool:
    return abs(value - chance) <= _CHANCE_TOL * abs(chance)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.4g}"


def _pct(x: float, signed: bool = False) -> str:
    return f"{x * 100:+.0f} %" if signed else f"{x * 100:.0f} %"

"""The strongest window of a rank's relative loss offset (doctor/evidence/loss.py), taken
for all windows at once, is the one the window-by-window reading picks: same mean, t
statistic, share on the mean's side and start, NaN windows never chosen."""

from __future__ import annotations

import math

import numpy as np

from syncdoctor.doctor.evidence.loss import OFFSET_WINDOW, _strongest_window


def _window_by_window(series: np.ndarray) -> tuple[float, float, float, int]:
    best = (0.0, 0.0, 0.0, 0)
    for start in range(0, len(series) - OFFSET_WINDOW + 1, OFFSET_WINDOW // 2):
        chunk = series[start : start + OFFSET_WINDOW]
        with np.errstate(invalid="ignore"):
            mu, sd = float(chunk.mean()), float(chunk.std(ddof=1))
        t = mu / (sd / math.sqrt(len(chunk))) if sd > 0 else (0.0 if mu == 0 else math.copysign(1e9, mu))
        if abs(t) > abs(best[1]):
            best = (mu, t, float((np.sign(chunk) == np.sign(mu)).mean()), start)
    return best


def test_the_strongest_window_is_the_one_read_window_by_window() -> None:
    rng = np.random.default_rng(7)
    cases = [
        rng.normal(size=n) * scale + shift for n in (19, 20, 39, 1000) for scale in (1e-3, 1) for shift in (0, 0.3)
    ]
    cases += [
        np.zeros(100),
        np.r_[np.zeros(50), np.ones(50)],  # a window of equal values: t = ±1e9
        np.r_[np.full(5, np.nan), rng.normal(size=60) + 3],  # the NaN window comes first
        np.r_[rng.normal(size=60), np.full(5, np.nan)],
        np.full(40, np.nan),
    ]
    for series in cases:
        want, got = _window_by_window(series), _strongest_window(series)
        assert got == want or str(got) == str(want), (len(series), want, got)

"""The one downsampler: a long per-rank series reduced for the diagnosis's plot
series and for the report's charts alike."""

from __future__ import annotations

import math

import numpy as np


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
    base = np.arange(buckets) * size
    idx = np.minimum(np.stack([base + np.minimum(lo, hi), base + np.maximum(lo, hi)], 1).ravel(), n - 1)
    xs, ys = x[idx], y[idx].copy()
    ys[1::2][bad.any(axis=1)] = np.nan
    return xs, ys

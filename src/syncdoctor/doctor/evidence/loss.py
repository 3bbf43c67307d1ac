"""The loss curves: the step × rank table, each curve's shape, persistent per-rank
offsets, and groups of ranks whose losses move together (they read the same data)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

from syncdoctor.doctor.evidence.sources import Facet, float_of
from syncdoctor.doctor.model import LossShape
from syncdoctor.doctor.shape import classify, sliding_median


@dataclass
class Offsets:
    """Persistent per-rank loss offsets against the same-step mean of all ranks.

    Judged in windows of consecutive steps: while the loss is large, a different
    loss definition shifts a rank's loss by a steady fraction; later, mini-batch
    noise of small losses drowns it. Healthy ranks on different data scatter
    around the mean with either sign."""

    by_rank: dict[int, float]  # mean relative offset in the rank's strongest window
    t_stat: dict[int, float]  # its t statistic
    same_sign: dict[int, float]  # fraction of that window's steps on the same side
    window: dict[int, tuple[int, int]]  # (first step, last step)
    spread: float  # median same-step relative spread


OFFSET_WINDOW = 20
SAME_DATA_MIN_CORR = 0.3


def _rolling_median(x: np.ndarray, k: int) -> np.ndarray:
    padded = np.pad(x, (k // 2, k // 2), mode="edge")
    return sliding_median(padded, k)


@np.errstate(divide="ignore", invalid="ignore")
def _strongest_window(series: np.ndarray) -> tuple[float, float, float, int]:
    """Of the windows of OFFSET_WINDOW consecutive values, starting every half window,
    the one whose mean is farthest from 0 in standard errors (the first of equals):
    its mean, t statistic, share of values on the mean's side, and start; zeros where
    no window's mean is off 0. All windows at once (a loop over them took a second
    at 256 ranks)."""
    if len(series) < OFFSET_WINDOW:
        return 0.0, 0.0, 0.0, 0
    chunks = np.lib.stride_tricks.sliding_window_view(series, OFFSET_WINDOW)[:: OFFSET_WINDOW // 2]
    mu = chunks.mean(axis=1)
    sd = chunks.std(axis=1, ddof=1)
    t = np.where(sd > 0, mu / (sd / math.sqrt(OFFSET_WINDOW)), np.where(mu == 0, 0.0, np.copysign(1e9, mu)))
    score = np.nan_to_num(np.abs(t), nan=0.0)  # a window with a NaN loss is never the strongest
    best = int(np.argmax(score))
    if not score[best] > 0:
        return 0.0, 0.0, 0.0, 0
    share = float((np.sign(chunks[best]) == np.sign(mu[best])).mean())
    return float(mu[best]), float(t[best]), share, best * (OFFSET_WINDOW // 2)


class Loss(Facet):
    """``ev.loss``: analyses of the loss curves (the curves themselves are ``ev.losses``)."""

    @cached_property
    def wide(self) -> pl.DataFrame:
        """step × rank table of losses, only steps every rank reported."""
        if not self.ev.losses.height:
            return pl.DataFrame()
        wide = self.ev.losses.pivot(on="rank", index="step", values="loss", aggregate_function="first")
        return wide.drop_nulls().sort("step")

    @cached_property
    def rank_shapes(self) -> list[LossShape]:
        out = []
        for (rank,), part in self.ev.losses.group_by(["rank"], maintain_order=True):
            out.append(classify(part["loss"].to_list(), part["step"].to_list(), rank=int(rank)))
        return sorted(out, key=lambda s: s.rank if s.rank is not None else -1)

    @cached_property
    def mean_shape(self) -> LossShape | None:
        if not self.ev.losses.height:
            return None
        mean = self.ev.losses.group_by("step").agg(pl.col("loss").mean()).sort("step")
        return classify(mean["loss"].to_list(), mean["step"].to_list(), rank=None)

    @cached_property
    def offsets(self) -> Offsets | None:
        wide = self.wide
        if wide.height < OFFSET_WINDOW or wide.width < 3:
            return None
        cols = [c for c in wide.columns if c != "step"]
        values = wide.select(cols)
        mean = values.mean_horizontal()
        rel = values.select([((pl.col(c) - mean) / mean.abs().clip(lower_bound=1e-12)).alias(c) for c in cols])
        steps = wide["step"].to_numpy()
        by_rank, t_stat, same_sign, window = {}, {}, {}, {}
        for c in cols:
            rank = int(c)
            mu, t, share, start = _strongest_window(rel[c].to_numpy())
            by_rank[rank], t_stat[rank], same_sign[rank] = mu, t, share
            window[rank] = (int(steps[start]), int(steps[min(len(steps) - 1, start + OFFSET_WINDOW - 1)]))
        spread = float_of(rel.select(pl.max_horizontal(cols) - pl.min_horizontal(cols)).to_series().median() or 0.0)
        return Offsets(by_rank, t_stat, same_sign, window, spread)

    @cached_property
    def same_data_groups(self) -> list[list[int]]:
        """Groups of ranks whose per-step losses move together far beyond chance:
        they read the same batches (dropout and other per-rank noise keep the losses
        from being identical). Residuals around the common trend of ranks on
        different data are uncorrelated."""
        wide = self.wide
        if wide.height < 30 or wide.width < 3:
            return []
        if self.mean_shape is None or self.mean_shape.shape != "decreasing":
            return []  # large, erratic updates move every rank's loss together too
        cols = [c for c in wide.columns if c != "step"]
        values = wide.select(cols).to_numpy().T
        if not np.isfinite(values).all() or (values <= 0).any():
            values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        else:
            values = np.log(values)  # multiplicative noise becomes additive
        trend = _rolling_median(values.mean(axis=0), 9)
        residual = values - trend
        if (residual.std(axis=1) == 0).any():
            identical: dict[bytes, list[int]] = {}
            for i, row in enumerate(values):
                identical.setdefault(row.tobytes(), []).append(int(cols[i]))
            return [sorted(g) for g in identical.values() if len(g) > 1]
        corr = np.corrcoef(residual)
        threshold = max(SAME_DATA_MIN_CORR, 4 / math.sqrt(values.shape[1]))
        parent = list(range(len(cols)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, j in zip(*np.nonzero(np.triu(corr > threshold, 1)), strict=True):
            parent[root(int(i))] = root(int(j))
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(cols):
            groups.setdefault(root(i), []).append(int(c))
        return [sorted(g) for g in groups.values() if len(g) > 1]

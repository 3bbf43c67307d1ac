"""The gradient reduction: whether the reduced gradient is larger than an average
can be (a sum), which ranks' gradients were left out of it, and whether it delivered
a gradient to the same parameters on every rank."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.replicas import Replicas
from syncdoctor.doctor.evidence.sources import Facet, Sources, float_of, int_of


@dataclass(frozen=True)
class GradientsApart:
    """The first check at which the ranks' updates had read gradients for different
    parameters (summed over the updates so far), and the last check before it."""

    step: int
    since: int | None  # the check before, where the sums agreed (None: the first check)
    missing: dict[int, int]  # rank -> how many missing gradients the updates read since `since`
    first: dict[int, str]  # rank -> the last of them, by name (ranks that missed none: absent)


class Reduce(Facet):
    """``ev.reduce``: what the gradient reduction did."""

    def __init__(self, ev: Sources, replicas: Replicas) -> None:
        super().__init__(ev)
        self.replicas = replicas

    @cached_property
    def excess(self) -> dict[str, float] | None:
        """Post-reduce norm over the mean local pre-reduce norm, per step. Averaging
        can never exceed 1 (triangle inequality); a sum of aligned gradients does."""
        if not self.ev.has_records or "grad_norm_local" not in self.ev.steps.columns:
            return None
        rows = self.ev.steps.filter(pl.col("grad_norm_local").is_not_null() & pl.col("grad_norm").is_not_null())
        if rows.height < 2:
            return None
        per_step = rows.group_by("step").agg(
            pl.col("grad_norm").median().alias("post"),
            pl.col("grad_norm_local").mean().alias("pre"),
            pl.len().alias("n"),
        )
        per_step = per_step.filter(pl.col("n") > 1)
        if not per_step.height:
            return None
        ratio = per_step["post"] / per_step["pre"]
        return {
            "median": float_of(ratio.median()),
            "above_one": float_of((ratio > 1.05).mean()),
            "steps": per_step.height,
        }

    @cached_property
    def unreduced_ranks(self) -> list[int]:
        """Ranks whose gradients came out of the reduction untouched (ratio exactly 1)
        while other ranks' were averaged."""
        if not self.ev.has_records or "reduce_ratio" not in self.ev.steps.columns:
            return []
        rows = self.ev.steps.filter(pl.col("reduce_ratio").is_not_null())
        div = self.replicas.divergence
        if div is not None and "grad" in div.what:
            # From the divergence on: a rank left out of the average after a fault was
            # averaged normally before it.
            later = rows.filter(pl.col("step") >= div.step)
            rows = later if later.height >= 2 else rows
        if rows.height < 2:
            return []
        frac = rows.group_by("rank").agg(((pl.col("reduce_ratio") - 1).abs() < 1e-6).mean().alias("f"))
        return sorted(int(r) for r, f in frac.iter_rows() if f > 0.5)

    @cached_property
    def gradients_apart(self) -> GradientsApart | None:
        """Where the parameters that held a gradient as the updates read them first
        differed across ranks (probe fields grads_missing*, summed over the updates:
        the first check at which the sums differ closes the interval that did it)."""
        steps = self.ev.steps if self.ev.has_records else None
        if steps is None or "grads_missing" not in steps.columns:
            return None
        fp = pl.col("grads_missing_fp") if "grads_missing_fp" in steps.columns else pl.lit(0)
        rows = steps.filter(pl.col("grads_missing").is_not_null()).with_columns(
            pl.struct(pl.col("grads_missing"), fp.fill_null(0)).alias("which")
        )
        per_check = (
            rows.group_by("step")
            .agg(pl.col("which").n_unique().alias("k"), pl.len().alias("n"))
            .filter(pl.col("n") == len(self.ev.ranks))
            .sort("step")
        )
        apart = per_check.filter(pl.col("k") > 1)
        if not apart.height:
            return None
        step = int_of(apart["step"][0])
        agreed = per_check.filter((pl.col("step") < step) & (pl.col("k") == 1))
        since = int_of(agreed["step"][-1]) if agreed.height else None
        at = rows.filter(pl.col("step") == step)
        before = rows.filter(pl.col("step") == since) if since is not None else None
        base = (
            {int(r): int(m) for r, m in zip(before["rank"], before["grads_missing"], strict=True)}
            if before is not None
            else {}
        )
        missing = {int(r): int(m) - base.get(int(r), 0) for r, m in zip(at["rank"], at["grads_missing"], strict=True)}
        names = at["grads_missing_first"] if "grads_missing_first" in at.columns else [None] * at.height
        first = {int(r): str(n) for r, n in zip(at["rank"], names, strict=True) if n is not None}
        return GradientsApart(step, since, missing, first)

"""The gradient reduction: whether the reduced gradient is larger than an average
can be (a sum), and which ranks' gradients were left out of it."""

from __future__ import annotations

from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.replicas import Replicas
from syncdoctor.doctor.evidence.sources import Facet, Sources, float_of


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

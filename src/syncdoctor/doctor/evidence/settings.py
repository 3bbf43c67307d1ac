"""Values every rank must share step by step: the learning rate in the records, and
the values the logs show (doctor/must_equal.py)."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import polars as pl

from syncdoctor.doctor.evidence.sources import Facet


class Settings(Facet):
    """``ev.settings``: values every rank must share, and where they differed."""

    @cached_property
    def log_partings(self) -> dict[str, Any]:
        """From the logs: the first step at which a value that must be equal on every
        rank (lr, loss scale, update counters, or a key the log shows shared) differs,
        per kind ({kind: must_equal.Parting}; doctor/must_equal.py)."""
        from syncdoctor.doctor.must_equal import partings

        values = getattr(self.ev.logs, "values", None)
        return partings(values) if isinstance(values, pl.DataFrame) else {}

    @cached_property
    def record_partings(self) -> dict[str, Any]:
        """From the probe records: the first step at which the loss scale (GradScaler's,
        or what the script reported) differs across ranks, as ``log_partings`` reads the
        logs ({"scale": must_equal.Parting}). Scaling comes before the update: the
        gradients the optimizer reads are unscaled by each rank's own scale."""
        from syncdoctor.doctor.must_equal import partings

        if not self.ev.has_records or "loss_scale" not in self.ev.steps.columns:
            return {}
        values = self.ev.steps.filter(pl.col("loss_scale").is_not_null()).select(
            "rank",
            "step",
            pl.lit("loss_scale").alias("key"),
            pl.col("loss_scale").cast(pl.Float64).alias("value"),
            pl.int_range(pl.len()).alias("line"),
            pl.lit("probe records").alias("source"),
        )
        return partings(values)

    @cached_property
    def rank_only_keys(self) -> list[Any]:
        """From the logs: keys some ranks add to the step line every rank prints and
        the others never print (must_equal.RankOnlyKey)."""
        from syncdoctor.doctor.must_equal import rank_only_keys

        values = getattr(self.ev.logs, "values", None)
        return rank_only_keys(values) if isinstance(values, pl.DataFrame) else []

    @cached_property
    def hyperparameter_drift(self) -> tuple[int, dict[int, Any]] | None:
        """The first step at which the ranks' learning rates differ (a schedule or a
        manual change applied on some ranks only): (step, {rank: lr})."""
        if not self.ev.has_records or "lr" not in self.ev.steps.columns:
            return None
        per_step = (
            self.ev.steps.filter(pl.col("lr").is_not_null())
            .group_by("step")
            .agg(pl.col("lr").n_unique().alias("k"), pl.len().alias("n"))
            .filter((pl.col("k") > 1) & (pl.col("n") > 1))
            .sort("step")
        )
        if not per_step.height:
            return None
        step = int(per_step["step"][0])
        at = self.ev.steps.filter(pl.col("step") == step)
        return step, dict(zip(at["rank"].to_list(), at["lr"].to_list(), strict=True))

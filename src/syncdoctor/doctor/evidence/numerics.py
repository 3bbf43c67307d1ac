"""Mixed-precision overflow: how many steps were skipped, and where the ranks
disagreed about skipping."""

from __future__ import annotations

from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.sources import Facet


class Numerics(Facet):
    """``ev.numerics``: the overflow skips of mixed precision."""

    @cached_property
    def overflow_disagreement(self) -> list[tuple[int, list[int]]]:
        """Steps where some ranks skipped for overflow and others did not."""
        if not self.ev.has_records or self.ev.steps["overflow"].null_count() == self.ev.steps.height:
            return []
        per = (
            self.ev.steps.filter(pl.col("overflow").is_not_null())
            .group_by("step")
            .agg(
                pl.col("overflow").sum().alias("k"),
                pl.len().alias("n"),
                pl.col("rank").filter(pl.col("overflow")).alias("ranks"),
            )
            .filter((pl.col("k") > 0) & (pl.col("k") < pl.col("n")))
            .sort("step")
        )
        return [(int(s), sorted(r)) for s, r in zip(per["step"], per["ranks"], strict=True)]

    @cached_property
    def overflow_steps(self) -> int:
        if not self.ev.has_records:
            return 0
        return int(self.ev.steps["overflow"].fill_null(False).sum())

"""Buffers nothing keeps in sync (BatchNorm statistics without SyncBatchNorm and the
like): whether and from which step they differed across ranks."""

from __future__ import annotations

from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.sources import Facet, int_of


class Buffers(Facet):
    """``ev.buffers``: buffers nothing keeps in sync, and when they first differed."""

    @cached_property
    def unsynced_differ(self) -> bool:
        return any(c.get("detail", {}).get("buffers_differ_unsynced") for c in self.ev.checks)

    @cached_property
    def first_unsynced_step(self) -> int | None:
        """The first check step at which buffers nothing keeps in sync differed."""
        if self.ev.has_records and "buffer_fp" in self.ev.steps.columns:
            per_step = (
                self.ev.steps.filter(pl.col("buffer_fp").is_not_null())
                .group_by("step")
                .agg(pl.col("buffer_fp").n_unique().alias("k"))
                .filter(pl.col("k") > 1)
            )
            if per_step.height:
                return int_of(per_step["step"].min())
        # Only the live check saw it: an ok block that covers several checks says no more
        # than its last step.
        steps = [c["step"] for c in self.ev.checks if c.get("detail", {}).get("buffers_differ_unsynced")]
        return min(steps) if steps else None

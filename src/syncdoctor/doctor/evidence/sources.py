"""What the doctor reads, as read: the probe records and the parsed logs, and the
few columns and lists every facet of the evidence works from (the step table, the
snapshots, the checks, the losses, the ranks). Every analysis lives in a facet
(the other modules of this package); a facet is handed these sources and the
facets it builds on."""

from __future__ import annotations

from functools import cached_property
from typing import Any, cast

import polars as pl

from syncdoctor.doctor.model import BaselineComparison
from syncdoctor.records import RunRecords
from syncdoctor.records.reader import MAX_WORLD_SIZE


# polars types a column's min, max, mean and median as any Python literal; on the numeric
# columns the doctor aggregates (step, rank, loss, ratios) it is a number: these say so.
def int_of(value: object) -> int:
    return int(cast(int, value))


def float_of(value: object) -> float:
    return float(cast(float, value))


def first_check_apart(rows: pl.DataFrame, column: str, n_ranks: int) -> tuple[int, int | None] | None:
    """Of the steps at which all `n_ranks` ranks recorded `column` (one row each in
    `rows`): the first whose values differ across ranks, and the last one before it
    at which they all agreed (None: none did). None where they never differ."""
    per_check = (
        rows.group_by("step")
        .agg(pl.col(column).n_unique().alias("k"), pl.len().alias("n"))
        .filter(pl.col("n") == n_ranks)
        .sort("step")
    )
    apart = per_check.filter(pl.col("k") > 1)
    if not apart.height:
        return None
    step = int_of(apart["step"][0])
    agreed = per_check.filter((pl.col("step") < step) & (pl.col("k") == 1))
    return step, (int_of(agreed["step"][-1]) if agreed.height else None)


class Sources:
    """The records and the logs, and the basic views of them."""

    def __init__(self, records: RunRecords | None = None, logs: Any = None, warnings: list[str] | None = None) -> None:
        self.records = records
        self.logs = logs
        self.warnings = list(warnings or [])
        # Set by `diagnose --baseline`: the comparison with a baseline run (doctor/baseline.py).
        self.baseline: BaselineComparison | None = None
        if records is not None:
            self.warnings += records.warnings
        if logs is not None:
            self.warnings += list(logs.warnings)

    @cached_property
    def steps(self) -> pl.DataFrame:
        return self.records.steps if self.records is not None else pl.DataFrame()

    @property
    def has_records(self) -> bool:
        return self.records is not None and self.steps.height > 0

    @cached_property
    def snapshots(self) -> dict[int, dict[str, Any]]:
        return self.records.snapshots if self.records is not None else {}

    @cached_property
    def checks(self) -> list[dict[str, Any]]:
        return self.records.checks if self.records is not None else []

    @cached_property
    def ranks(self) -> list[int]:
        ranks: set[int] = set()
        if self.records is not None:
            ranks.update(self.records.ranks)
        if self.losses.height:
            ranks.update(r for r in self.losses["rank"].unique().to_list() if r is not None)
        return sorted(ranks)

    @cached_property
    def world_size(self) -> int | None:
        # Only sizes a real job can have: the report lists every rank up to it.
        sizes = [
            n for s in self.snapshots.values() if isinstance(n := s.get("world_size"), int) and 0 < n <= MAX_WORLD_SIZE
        ]
        if sizes:
            return max(sizes)
        return max(self.ranks) + 1 if self.ranks and max(self.ranks) < MAX_WORLD_SIZE else None

    @cached_property
    def losses(self) -> pl.DataFrame:
        """rank, step, loss: probe records first (exact), else parsed logs."""
        if self.records is not None and self.steps.height and self.steps["loss"].null_count() < self.steps.height:
            # NaN and inf stay (the reader restores them): they are evidence.
            return self.steps.select("rank", "step", "loss").filter(pl.col("loss").is_not_null())
        if self.logs is not None and self.logs.losses.height:
            frame = self.logs.losses.select("rank", "step", "loss")
            if frame["rank"].null_count() == frame.height:
                frame = frame.with_columns(pl.lit(0, dtype=pl.Int64).alias("rank"))
            return (
                frame.filter(pl.col("rank").is_not_null() & pl.col("step").is_not_null())
                .unique(["rank", "step"], keep="last")
                .sort("rank", "step")
            )
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "loss": pl.Float64})

    @cached_property
    def step_counts(self) -> dict[int, int]:
        if self.has_records:
            agg = self.steps.group_by("rank").agg(pl.col("step").max())
            return {int(r): int(s) for r, s in agg.iter_rows()}
        if self.losses.height:
            agg = self.losses.group_by("rank").agg(pl.col("step").max())
            return {int(r): int(s) for r, s in agg.iter_rows() if r is not None}
        return {}

    def snapshot_values(self, *path: str) -> dict[int, Any]:
        out = {}
        for rank, snap in self.snapshots.items():
            value: Any = snap
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            out[rank] = value
        return out

    def differing(self, *path: str) -> dict[int, Any] | None:
        values = self.snapshot_values(*path)
        if len(values) < 2:
            return None
        keys = {repr(v) for v in values.values()}
        return values if len(keys) > 1 else None


class Facet:
    """One facet of the evidence: a group of related analyses over the sources,
    each computed once (cached properties)."""

    def __init__(self, ev: Sources) -> None:
        self.ev = ev

"""The fingerprints that must be equal within each replica group, as one long
table per kind (param, opt, grad), and the first step at which they part."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import polars as pl

from syncdoctor.doctor.evidence.placement import Placement
from syncdoctor.doctor.evidence.sources import Facet, Sources, int_of
from syncdoctor.records.compare import majority_outliers


class Fingerprints(Facet):
    """``ev.fingerprints``: the long fingerprint tables and where they first part."""

    def __init__(self, ev: Sources, placement: Placement) -> None:
        super().__init__(ev)
        self.placement = placement

    @cached_property
    def _by_kind(self) -> dict[str, pl.DataFrame]:
        return {kind: self._build(kind) for kind in ("param", "opt", "grad")}

    def long(self, kind: str) -> pl.DataFrame:
        return self._by_kind[kind]  # built once: the divergence and agree_after read it often

    def _build(self, kind: str) -> pl.DataFrame:
        """rank, step, class, key, value: the fingerprints of `kind` (param, opt, grad)
        per placement class, with the replica key each rank holds for it. Under plain
        data parallelism: one class whose key is the same on every rank."""
        steps = self.ev.steps
        if kind == "opt" and not self.placement.opt_state_replicated:
            return pl.DataFrame()  # sharded optimizer state is no replica: nothing to compare
        if not self.placement.replica:
            column = f"{kind}_fp"
            if column not in steps.columns:
                return pl.DataFrame()
            return steps.filter(pl.col(column).is_not_null()).select(
                "rank",
                "step",
                pl.lit(0, dtype=pl.Int64).alias("class"),
                pl.lit(1, dtype=pl.Int64).alias("key"),
                pl.col(column).alias("value"),
            )
        if "replica_fps" not in steps.columns:
            return pl.DataFrame()
        values = (
            steps.filter(pl.col("replica_fps").is_not_null())
            .select("rank", "step", pl.col("replica_fps").struct.field(kind).alias("value"))
            .filter(pl.col("value").is_not_null())
            .with_columns(pl.int_ranges(0, pl.col("value").list.len(), dtype=pl.Int64).alias("class"))
            .explode("value", "class")
        )
        keys = pl.DataFrame(
            [
                (r, c, int(k))
                for r, info in self.placement.replica.items()
                for c, k in enumerate(info.get("keys") or [])
            ],
            schema={"rank": pl.Int64, "class": pl.Int64, "key": pl.Int64},
            orient="row",
        )
        return values.join(keys, on=["rank", "class"])

    def first_measured(self, kind: str, step: int) -> int | None:
        frame = self.long(kind)
        later = frame.filter(pl.col("step") >= step) if frame.height else frame
        return int_of(later["step"].min()) if later.height else None

    def first_disagreement(
        self, kind: str, start: int | None = None, end: int | None = None
    ) -> tuple[int, list[int], list[dict[str, Any]]] | None:
        """The first step (in [start, end]) where ranks that must hold the same `kind`
        do not: (step, the odd ranks, the replica groups that parted there)."""
        frame = self.long(kind)
        if not frame.height:
            return None
        if start is not None:
            frame = frame.filter(pl.col("step") >= start)
        if end is not None:
            frame = frame.filter(pl.col("step") <= end)
        groups = (
            frame.group_by("step", "class", "key")
            .agg(pl.col("value").n_unique().alias("k"), pl.col("rank"), pl.col("value"))
            .filter(pl.col("k") > 1)
            .sort("step", "class")
        )
        if not groups.height:
            return None
        step = int(groups["step"][0])
        classes = next(iter(self.placement.replica.values())).get("classes") if self.placement.replica else None
        parted = []
        for row in groups.filter(pl.col("step") == step).iter_rows(named=True):
            values = dict(zip(row["rank"], row["value"], strict=True))
            group: dict[str, Any] = {
                "class": row["class"],
                "members": sorted(values),
                "odd": majority_outliers(values),
                "what": [kind],
            }
            if classes and row["class"] < len(classes):
                group["dims"] = classes[row["class"]]
            parted.append(group)
        return step, sorted({r for g in parted for r in g["odd"]}), parted

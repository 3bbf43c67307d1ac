"""What each rank read: identical batches on ranks of different shards, steps per
epoch, and sample ids that overlap across ranks or repeat epoch after epoch."""

from __future__ import annotations

from collections import Counter
from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.placement import Placement
from syncdoctor.doctor.evidence.sources import Facet, Sources, int_of


class Data(Facet):
    """``ev.data``: what each rank read, from the batch fingerprints and sample ids."""

    def __init__(self, ev: Sources, placement: Placement) -> None:
        super().__init__(ev)
        self.placement = placement

    @cached_property
    def duplicate_batches(self) -> tuple[float, list[list[int]]]:
        """Fraction of steps where two ranks consumed identical batches, and which ranks."""
        if not self.ev.has_records or self.ev.steps["data_fp"].null_count() == self.ev.steps.height:
            return 0.0, []
        rows = self.ev.steps.filter(pl.col("data_fp").is_not_null())
        if self.placement.replica:
            # Ranks of one data shard (tensor-parallel peers) read the same batch by design.
            keys = pl.DataFrame(
                [(r, info.get("data_key")) for r, info in self.placement.replica.items()],
                schema={"rank": pl.Int64, "data_key": pl.Int64},
                orient="row",
            )
            rows = rows.join(keys, on="rank", how="left").with_columns(
                pl.col("data_key").fill_null(-1 - pl.col("rank"))
            )
            dup = (
                rows.group_by("step", "data_fp")
                .agg(pl.col("rank"), pl.col("data_key").n_unique().alias("keys"))
                .filter(pl.col("keys") > 1)
            )
        else:
            dup = rows.group_by("step", "data_fp").agg(pl.col("rank")).filter(pl.col("rank").list.len() > 1)
        n_steps = rows["step"].n_unique()
        if not dup.height:
            return 0.0, []
        groups = Counter(tuple(sorted(g)) for g in dup["rank"].to_list())
        return dup["step"].n_unique() / max(1, n_steps), [list(g) for g, _ in groups.most_common(4)]

    @cached_property
    def first_duplicate_step(self) -> int | None:
        """The first step at which two ranks of different data shards read the same batch."""
        fraction, groups = self.duplicate_batches
        if not groups:
            return None
        rows = self.ev.steps.filter(pl.col("data_fp").is_not_null() & pl.col("rank").is_in(groups[0]))
        dup = rows.group_by("step", "data_fp").agg(pl.len().alias("n")).filter(pl.col("n") > 1)
        return int_of(dup["step"].min()) if dup.height else None

    @cached_property
    def epoch_steps(self) -> int | None:
        """Steps per epoch from the loader snapshot (dataset length / global batch)."""
        for snap in self.ev.snapshots.values():
            loader = snap.get("loader") or {}
            n, bs = loader.get("dataset_len"), loader.get("batch_size")
            replicas = loader.get("num_replicas") or snap.get("world_size") or 1
            if n and bs:
                # Gradient accumulation consumes several batches per optimizer step.
                world, global_batch = snap.get("world_size") or 1, snap.get("global_batch")
                accum = max(1, int(global_batch // (bs * world))) if global_batch else 1
                return max(1, int(n // (bs * replicas * accum)))
        return None

    @cached_property
    def sample_overlap(self) -> dict[str, float] | None:
        """Within the first epoch: how many sample ids two ranks both consumed
        (disjoint under correct sharding), and whether each rank reads the same
        fixed subset epoch after epoch (shuffle after shard)."""
        if (
            not self.ev.has_records
            or "ids" not in self.ev.steps.columns
            or self.ev.steps["ids"].null_count() == self.ev.steps.height
        ):
            return None
        window = self.epoch_steps
        if not window:
            return None
        ids = self.ev.steps.filter(pl.col("ids").is_not_null()).select("rank", "step", "ids")
        first = ids.filter(pl.col("step") <= window)
        second = ids.filter((pl.col("step") > window) & (pl.col("step") <= 2 * window))
        per_rank = {int(r): set(g["ids"].explode().to_list()) for (r,), g in first.group_by(["rank"])}
        if len(per_rank) < 2:
            return None
        total = sum(len(s) for s in per_rank.values())
        union = set().union(*per_rank.values())
        cross_overlap = 1 - len(union) / total if total else 0.0
        same_subset = []
        for (r,), g in second.group_by(["rank"]):
            later = set(g["ids"].explode().to_list())
            earlier = per_rank.get(int(r), set())
            if later and earlier:
                same_subset.append(len(later & earlier) / len(later | earlier))
        return {
            "cross_overlap": cross_overlap,
            "same_subset": min(same_subset) if same_subset else 0.0,
            "coverage": len(union),
        }

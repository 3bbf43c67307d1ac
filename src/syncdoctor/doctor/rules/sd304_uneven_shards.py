from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split
from syncdoctor.rulebook import fmt_ranks


class UnevenShards(Rule):
    """Ranks get different numbers of samples, so they run different numbers of steps.

    **Symptom:** partial last batches on some ranks, the job hangs or fails at an
    epoch end with a collective timeout or "connection closed" while other ranks
    finished.

    **Cause:** shards of unequal size without `drop_remainder=True` / `drop_last=True`
    (or file-level sharding with files of different sizes).

    **Quick check:** print `dataset.get_dataset_size()` / `len(loader)` on every rank.

    Silent where every rank trained under torch's `Join` context manager (the probe
    records it), which is the recipe for uneven inputs, unless a rank still waited.

    **Fix:** make every rank run the same number of steps: `drop_remainder=True`
    (MindSpore) / `drop_last=True` (DistributedSampler and DataLoader), or pad the
    shards to equal length.
    """

    code = "SD304"
    name = "uneven-shards"
    category = "data.sharding"
    stage = "data"
    title = "Uneven shards: ranks run different step counts"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence: list[str] = []
        ranks: set[int] = set()
        confidence = 0.0
        if ev.has_records and "samples" in ev.steps.columns:
            # Only at steps where every rank ran as many micro-steps: where they split an
            # update differently, the accumulation layout differs (SD402, SD411), not the shards.
            per_micro = ev.steps.filter(pl.col("samples").is_not_null() & (pl.col("micro") > 0)).with_columns(
                (pl.col("samples") / pl.col("micro")).alias("per_micro")
            )
            per_step = (
                per_micro.group_by("step")
                .agg(
                    pl.col("per_micro").n_unique().alias("k"),
                    pl.col("micro").n_unique().alias("layouts"),
                    pl.col("per_micro").min().alias("lo"),
                    pl.col("per_micro").max().alias("hi"),
                )
                .filter((pl.col("k") > 1) & (pl.col("layouts") == 1))
                .sort("step")
            )
            if per_step.height:
                row = per_step.row(0, named=True)
                evidence.append(
                    f"ranks consumed different batch sizes at {per_step.height} steps "
                    f"(first at step {row['step']}: {row['lo']:g} vs {row['hi']:g} samples)"
                )
                confidence = 0.6
        counts = ev.step_counts
        # A crash or a skipped update also leaves ranks at different counts; those have their own rules.
        explained = ev.events.first_failure is not None or (
            ev.replicas.divergence is not None and "counter" in ev.replicas.divergence.what
        )
        if not explained and len(counts) > 1 and len(set(counts.values())) > 1 and self._beyond_one_print(ev, counts):
            lo, hi = min(counts.values()), max(counts.values())
            short = [r for r, n in counts.items() if n == lo]
            evidence.append(f"ranks ran different step counts: {lo} on {fmt_ranks(short)} vs up to {hi}")
            ranks.update(short)
            confidence = max(confidence, 0.7)
        shard_sizes = self._shard_sizes(ev)
        if shard_sizes:
            # Each rank's own shard: with whole batches only (drop_remainder) the steps look
            # alike until the longer shard's extra batches meet no partner.
            evidence.append("the ranks' shards hold different numbers of samples: " + describe_split(shard_sizes))
            ranks.update(agreement(shard_sizes).odd)
            confidence = max(
                confidence, 0.75 if len(evidence) > 1 or ev.events.first_failure or ev.events.ended_early else 0.65
            )
        drop = {(info or {}).get("drop_last") for info in ev.snapshot_values("loader").values()}
        if False in drop and evidence:
            evidence.append("the loader does not drop the last partial batch (drop_last=False)")
            confidence += 0.15
        finished = [r for r, end in (ev.records.ends.items() if ev.records else []) if end.get("status") == "ok"]
        stuck: Sequence[int | None] = ev.events.ended_early or [c.get("rank") for c in ev.replicas.incomplete_checks]
        if evidence and finished and stuck:
            evidence.append(
                f"{fmt_ranks(finished)} finished while {fmt_ranks(set(stuck))} waited on a collective nobody else made"
            )
            ranks.update(int(r) for r in stuck if r is not None)
            confidence += 0.1
        if not confidence:
            return None
        if ev.ranks and set(ev.ranks) <= ev.events.joined and not (finished and stuck):
            # Every rank trained under torch's Join: a rank out of batches shadows the
            # others' collectives, so uneven shards are the design, not a fault.
            return None
        return self.found(confidence, evidence, ranks=sorted(ranks))

    @staticmethod
    def _beyond_one_print(ev: Evidence, counts: dict[int, int]) -> bool:
        """From logs, ranks print their steps at some interval and a log (or a pasted
        excerpt) ends between two prints: last steps that differ by no more than one
        print interval say nothing about the work each rank did."""
        if ev.has_records or not ev.losses.height:
            return True
        gaps = ev.losses.sort("rank", "step").group_by("rank").agg(pl.col("step").diff().median().alias("g"))
        interval = max((g for g in gaps["g"].to_list() if g is not None), default=1)
        return max(counts.values()) - min(counts.values()) > interval

    @staticmethod
    def _shard_sizes(ev: Evidence) -> dict[int, int] | None:
        """Samples in each rank's data set, when they differ: one data set cut by a
        sampler has one length everywhere, so different lengths are per-rank shards
        (files, slices, `dataset.shard`) of different sizes."""
        sizes = {}
        for rank, info in ev.snapshot_values("loader").items():
            n = (info or {}).get("dataset_len")
            if isinstance(n, int) and not isinstance(n, bool):
                sizes[rank] = n
        if len(sizes) < 2 or len(set(sizes.values())) == 1:
            return None
        return sizes

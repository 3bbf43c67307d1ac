"""The gradient reduction: whether the reduced gradient is larger than an average
can be (a sum), which ranks' gradients were left out of it, whether it delivered
a gradient to the same parameters on every rank, whether the ranks agreed on which
micro-steps synchronise, and whether the gradients changed between it and the
update on some ranks only."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import polars as pl

from syncdoctor.doctor.evidence.replicas import Replicas
from syncdoctor.doctor.evidence.sources import Facet, Sources, first_check_apart, float_of, int_of


@dataclass(frozen=True)
class GradientsApart:
    """The first check at which the ranks' updates had read gradients for different
    parameters (summed over the updates so far), and the last check before it."""

    step: int
    since: int | None  # the check before, where the sums agreed (None: the first check)
    missing: dict[int, int]  # rank -> how many missing gradients the updates read since `since`
    first: dict[int, str]  # rank -> the last of them, by name (ranks that missed none: absent)


@dataclass(frozen=True)
class SyncApart:
    """The first backward() call at which the ranks disagreed about whether DDP
    all-reduces (probe fields syncs, pending_syncs): the update it was for, the call's
    place in it, each rank's flag there and each rank's schedule for that update."""

    step: int  # the update the calls were for
    call: int  # 1-based: the first call whose flag differs
    synced: dict[int, bool]  # rank -> whether that call all-reduced
    schedules: dict[int, str]  # rank -> its calls for that update ("s" synchronised, "n" no_sync)
    at_end: bool  # from the end records: the calls after each rank's last update


@dataclass(frozen=True)
class ChangedAfterReduce:
    """The first step at which the ranks' gradients were seen change between the
    all-reduce and the update in different ways: by different in-place writes
    (grad_writes, every check) or, with every rank holding the same gradient right
    after the all-reduce (grad_reduced_fp), different gradients at the update (grad_fp,
    detailed steps)."""

    step: int
    how: str  # "writes" | "values"
    per_rank: dict[int, int]  # rank -> its writes, or its grad_fp at the update
    # The ranks that changed what the all-reduce delivered, where others updated from it
    # unchanged (wrote nothing into it; grad_fp equal to grad_reduced_fp): whoever the
    # majority is, these ran the code the others did not. Empty where every rank changed it.
    changers: tuple[int, ...] = ()


@dataclass(frozen=True)
class UnsyncedUpdates:
    """The first check at which some rank had applied updates that read unaveraged
    gradients (probe fields unsynced_updates, unsynced_first, unsynced_how): per rank,
    how many so far and the step of the first (ranks with none: absent), and how the
    probe knew: every backward() since the previous update inside DDP's no_sync, or,
    in a hand-written loop, no dist.all_reduce of a gradient since the previous update."""

    step: int  # the check that first showed them
    count: dict[int, int]
    first: dict[int, int]
    hand_written: bool = False  # every such rank: no all_reduce call (no DDP wrapper), not no_sync


def _first_apart(schedules: dict[int, str]) -> int | None:
    """The first call index (0-based) where two ranks' schedules hold different flags."""
    for call in range(min(map(len, schedules.values()), default=0)):
        if len({s[call] for s in schedules.values()}) > 1:
            return call
    return None


class Reduce(Facet):
    """``ev.reduce``: what the gradient reduction did."""

    def __init__(self, ev: Sources, replicas: Replicas) -> None:
        super().__init__(ev)
        self.replicas = replicas

    @cached_property
    def excess(self) -> dict[str, float] | None:
        """Post-reduce norm over the mean local pre-reduce norm, per step. Averaging
        can never exceed 1 (triangle inequality); a sum of aligned gradients does.
        Only steps at which every rank updated from the same gradient count: a sum
        delivers one tensor to every rank, so where the ranks' gradients at the update
        differ, what made them larger came after the reduce (grad_norm is read at the
        update), and the ratio says nothing about the reduce op."""
        if not self.ev.has_records or "grad_norm_local" not in self.ev.steps.columns:
            return None
        rows = self.ev.steps.filter(pl.col("grad_norm_local").is_not_null() & pl.col("grad_norm").is_not_null())
        if rows.height < 2:
            return None
        # (Under sharding each rank's grad_fp is its own shard's: no replica to compare.)
        compared = "grad_fp" in rows.columns and not self.replicas.placement.replica
        fp = pl.col("grad_fp") if compared else pl.lit(None, dtype=pl.Int64)
        per_step = rows.group_by("step").agg(
            pl.col("grad_norm").median().alias("post"),
            pl.col("grad_norm_local").mean().alias("pre"),
            pl.len().alias("n"),
            fp.drop_nulls().n_unique().alias("grads_at_update"),
        )
        per_step = per_step.filter((pl.col("n") > 1) & (pl.col("grads_at_update") <= 1))
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
        apart = first_check_apart(rows, "which", len(self.ev.ranks))
        if apart is None:
            return None
        step, since = apart
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

    @cached_property
    def sync_apart(self) -> SyncApart | None:
        """Where the ranks' sync schedules first differ: at a check step (every rank
        records its update's schedule there), else in the calls after each rank's last
        update as its end record left them (a hang in a synchronised backward)."""
        if self.ev.records is None:
            return None
        steps = self.ev.steps
        if self.ev.has_records and "syncs" in steps.columns and "param_fp" in steps.columns:
            # Each rank's schedule at each check; absent: one synchronised call where the
            # rank ran one micro-step (more: not observed).
            schedule = (
                pl.when(pl.col("syncs").is_not_null())
                .then(pl.col("syncs"))
                .when(pl.col("micro") == 1)
                .then(pl.lit("s"))
            )
            checked = (
                steps.filter(pl.col("param_fp").is_not_null() & pl.col("micro").is_not_null())
                .with_row_index("_at")
                .select("_at", "step", "rank", schedule.alias("_schedule"))
            )
            # Only the check steps where some schedules differ are looked at (in the order
            # the steps first appear), not every check step rank by rank: 0.4 s of a
            # diagnosis at 256 ranks, where they all agreed.
            differing = (
                checked.group_by("step")
                .agg(pl.col("_at").first(), pl.col("_schedule").drop_nulls().n_unique().alias("_kinds"))
                .filter(pl.col("_kinds") > 1)
                .sort("_at")["step"]
            )
            for step in differing:
                rows = checked.filter((pl.col("step") == step) & pl.col("_schedule").is_not_null())
                schedules = {int(r): str(s) for r, s in zip(rows["rank"], rows["_schedule"], strict=True)}
                call = _first_apart(schedules)  # (two schedules at least: they differ)
                if call is not None:
                    return self._apart(int_of(step), call, schedules, at_end=False)
        ends = self.ev.records.ends
        pending = {r: e for r, e in ends.items() if e.get("pending_syncs")}
        by_step: dict[int, dict[int, str]] = {}
        for r, end in pending.items():
            by_step.setdefault(int(end.get("step") or 0), {})[int(r)] = str(end["pending_syncs"])
        for step, schedules in sorted(by_step.items()):
            call = _first_apart(schedules) if len(schedules) > 1 else None
            if call is not None:
                return self._apart(step + 1, call, schedules, at_end=True)
        return None

    @staticmethod
    def _apart(step: int, call: int, schedules: dict[int, str], at_end: bool) -> SyncApart:
        synced = {r: s[call] == "s" for r, s in schedules.items()}
        return SyncApart(step, call + 1, synced, schedules, at_end)

    @cached_property
    def same_work_per_update(self) -> dict[int, tuple[int, int]] | None:
        """Ranks that split each update into different numbers of micro-steps yet do the
        same data-parallel work per update: at every check step where their micro-steps
        differ, each rank read the same number of samples, made the same number of
        synchronised backward() calls and made its last call before the update
        synchronised, so the all-reduces pair one to one and every update reads an
        averaged gradient (a smaller micro-batch on one rank, compensated by
        accumulation). Per rank: (micro-steps, samples) per update at the first such
        check. None where some such check says otherwise or cannot tell (no samples,
        no schedule)."""
        steps = self.ev.steps
        if not self.ev.has_records or not {"samples", "micro", "param_fp"} <= set(steps.columns):
            return None
        syncs = pl.col("syncs") if "syncs" in steps.columns else pl.lit(None, dtype=pl.String)
        checked = steps.filter(pl.col("param_fp").is_not_null() & pl.col("micro").is_not_null())
        first: dict[int, tuple[int, int]] | None = None
        for _, rows in checked.select("step", "rank", "micro", "samples", syncs.alias("syncs")).group_by(
            "step", maintain_order=True
        ):
            micro = rows["micro"].to_list()
            if len(set(micro)) < 2:
                continue
            samples = rows["samples"].to_list()
            if None in samples or len(set(samples)) > 1:
                return None
            schedules = [
                schedule if schedule is not None else ("s" if m == 1 else None)  # absent: one synchronised call
                for m, schedule in zip(micro, rows["syncs"].to_list(), strict=True)
            ]
            if None in schedules or len({c.count("s") for c in schedules}) > 1:  # type: ignore[union-attr]
                return None
            if not all(c.endswith("s") for c in schedules):  # type: ignore[union-attr]
                return None
            if first is None:
                first = {int(r): (int(m), int(n)) for r, m, n in zip(rows["rank"], micro, samples, strict=True)}
        return first

    @cached_property
    def unsynced_updates(self) -> UnsyncedUpdates | None:
        """Updates that read gradients no all-reduce averaged: every backward() since the
        previous update ran inside no_sync, or a hand-written loop called no all_reduce
        of a gradient since then, on some ranks or on all."""
        steps = self.ev.steps
        if not self.ev.has_records or "unsynced_updates" not in steps.columns:
            return None
        rows = steps.filter(pl.col("unsynced_updates").is_not_null())
        if rows.height == 0:
            return None
        step = int_of(rows["step"].min())
        at = rows.filter(pl.col("step") == step).unique("rank", keep="last")
        how = set(at["unsynced_how"].to_list()) if "unsynced_how" in at.columns else {None}
        return UnsyncedUpdates(
            step,
            {int(r): int(n) for r, n in zip(at["rank"], at["unsynced_updates"], strict=True)},
            {int(r): int(f) for r, f in zip(at["rank"], at["unsynced_first"], strict=True)},
            hand_written=how == {"no_all_reduce"},
        )

    @cached_property
    def changed_after_reduce(self) -> ChangedAfterReduce | None:
        """Gradients that something between the all-reduce and the update (clipping,
        unscaling, manual scaling, code under a rank branch) changed on some ranks only."""
        ev = self.ev
        if not ev.has_records or len(ev.ranks) < 2:
            return None
        found = [
            c
            for c in (
                self._first_differing("grad_writes", "writes"),
                self._first_differing("grad_fp", "values", agreed="grad_reduced_fp"),
            )
            if c is not None
        ]
        return min(found, key=lambda c: c.step) if found else None

    def _first_differing(self, column: str, how: str, agreed: str | None = None) -> ChangedAfterReduce | None:
        """The first step at which every rank recorded `column` (and `agreed`, equal on
        every rank) and the ranks' `column` differ."""
        steps = self.ev.steps
        needed = [column] + ([agreed] if agreed else [])
        if any(c not in steps.columns for c in needed):
            return None
        rows = steps.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in needed)).unique(
            ["rank", "step"], keep="last"
        )
        per_step = rows.group_by("step").agg(
            pl.len().alias("n"),
            pl.col(column).n_unique().alias("values"),
            *([pl.col(agreed).n_unique().alias("agreed")] if agreed else []),
        )
        per_step = per_step.filter((pl.col("n") == len(self.ev.ranks)) & (pl.col("values") > 1))
        if agreed:
            per_step = per_step.filter(pl.col("agreed") == 1)
        if per_step.height == 0:
            return None
        step = int(per_step["step"].min())  # type: ignore[arg-type]
        at = rows.filter(pl.col("step") == step)
        per_rank = {int(r): int(v) for r, v in zip(at["rank"], at[column], strict=True)}
        delivered = at[agreed][0] if agreed else 0  # what the all-reduce left: its fingerprint, or no write
        changers = tuple(sorted(r for r, v in per_rank.items() if v != delivered))
        return ChangedAfterReduce(step, how, per_rank, changers if len(changers) < len(per_rank) else ())

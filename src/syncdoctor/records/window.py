"""Bounded reading of a big run's step records from the columnar cache (docs/records.md,
"Big runs").

A run of 1,024 ranks × 100,000 steps holds 10⁸ step records: more than a machine's
memory once in a frame, and more than any rule needs. The rules need every step where
something happens (the first and last steps, the first step where ranks disagree on a
value they must share, the first non-finite loss, the last steps before a rank
stopped) and the shape of each rank's curves elsewhere. So a run with more step
records than ``SYNCDOCTOR_FULL_DETAIL_ROWS`` (default DEFAULT_ROWS) is read in two
passes over the Parquet cache, each going through its parts a batch of ranks at a time
(cache.BATCH_ROWS records): memory for a batch and the result, not the run:

1. triage: per step, the lowest and highest value of every column the ranks must
   share, how many ranks wrote the step, how many losses were not finite; per rank,
   its first and last step. This finds the steps that matter.
2. the model: every rank's records at the steps within ``window`` of each of those,
   and at evenly spaced steps elsewhere (check steps among them, where fingerprints
   were taken), up to the row budget. The same steps for every rank, so the ranks
   stay comparable at each step read.

The rules then run on that frame unchanged; the reader's warnings say which steps
were read. Runs at or under the budget (every run the tests use) are read whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import polars as pl

FULL_DETAIL_ENV = "SYNCDOCTOR_FULL_DETAIL_ROWS"
DEFAULT_ROWS = 1_000_000
# Steps either side of a step that matters, at least; widened to three check intervals.
MIN_WINDOW = 32
# The most steps that matter, of each kind, kept (the earliest).
MAX_CENTRES = 8

# Columns that are per rank by nature: never a sign that ranks disagree.
_PER_RANK = {
    "v",
    "kind",
    "rank",
    "step",
    "t",
    "loss",
    "grad_norm_local",
    "reduce_ratio",
    "data_fp",
    "samples",
    "uncovered_first",
    "params_rebound_first",
    "grads_missing_first",
}


def budget() -> int:
    """Step records read whole at most; 0 means always whole."""
    raw = os.environ.get(FULL_DETAIL_ENV, "").strip()
    try:
        return max(0, int(raw)) if raw else DEFAULT_ROWS
    except ValueError:
        return DEFAULT_ROWS


@dataclass
class Triage:
    """What the triage pass found (step numbers)."""

    steps: list[int]  # every step some rank wrote, ascending
    checked: list[int]  # the steps with parameter fingerprints
    ranks: int
    ends: pl.DataFrame = field(default_factory=pl.DataFrame)  # rank, first, last step
    centres: dict[str, list[int]] = field(default_factory=dict)  # why -> steps that matter
    window: int = MIN_WINDOW

    def to_json(self) -> dict[str, Any]:
        """As the cache's index keeps it (records/cache.py)."""
        return {
            "steps": self.steps,
            "checked": self.checked,
            "ranks": self.ranks,
            "ends": [self.ends["rank"].to_list(), self.ends["first"].to_list(), self.ends["last"].to_list()],
            "centres": self.centres,
            "window": self.window,
        }

    @classmethod
    def from_json(cls, kept: dict[str, Any]) -> Triage:
        rank, first, last = kept["ends"]
        ends = pl.DataFrame({"rank": rank, "first": first, "last": last}, schema=_ENDS_SCHEMA)
        return cls(kept["steps"], kept["checked"], kept["ranks"], ends, kept["centres"], kept["window"])


_ENDS_SCHEMA = {"rank": pl.Int64, "first": pl.Int64, "last": pl.Int64}


def _shared_columns(schema: pl.Schema) -> list[str]:
    return [
        name
        for name, dtype in schema.items()
        if name not in _PER_RANK and not isinstance(dtype, (pl.List, pl.Struct, pl.Array))
    ]


class Tally:
    """The triage's per-step and per-rank aggregates, fed a batch of step records at a
    time, each batch's folded into the running ones (which hold one row per step and
    per rank): memory for a batch, not the run. (One streaming query over every part
    held the whole run at 1,024 ranks × 100,000 steps: 19 GiB.) Fed from the cache's
    parts by ``triage``, or from the step records as the cache is built (records/reader.py),
    so that a first read does not decode the parts twice."""

    def __init__(self, schema: pl.Schema) -> None:
        """``schema``: the columns a batch may have; a batch may lack some (one whose
        column is null in every record: its aggregates would be null too)."""
        self.shared = _shared_columns(schema)
        wanted = ["rank", "step", *(c for c in ("loss", "param_fp") if c in schema), *self.shared]
        self.columns = list(dict.fromkeys(wanted))  # the columns it reads, once each
        self.per_step: pl.DataFrame | None = None
        self.ranks: list[pl.DataFrame] = []

    def reads(self, valued: set[str]) -> list[str]:
        """The columns it reads, of those that hold a value (``valued``): a batch needs
        no others."""
        return [name for name in self.columns if name in valued]

    def _aggregates(self, names: set[str]) -> list[pl.Expr]:
        aggs = [pl.len().alias("_n")]
        for i, name in enumerate(self.shared):
            if name in names:
                aggs += [pl.col(name).min().alias(f"_lo{i}"), pl.col(name).max().alias(f"_hi{i}")]
        if "loss" in names:
            aggs.append((pl.col("loss").is_nan() | pl.col("loss").is_infinite()).sum().alias("_nonfinite"))
        if "param_fp" in names:
            aggs.append(pl.col("param_fp").is_not_null().sum().alias("_checked"))
        return aggs

    @staticmethod
    def _folds(columns: list[str]) -> list[pl.Expr]:
        """Two batches' aggregates of a step as one: the lowest of the lows, the highest
        of the highs, the sum of the counts."""
        return [
            pl.col(c).min() if c.startswith("_lo") else pl.col(c).max() if c.startswith("_hi") else pl.col(c).sum()
            for c in columns
            if c != "step"
        ]

    def add(self, batch: pl.LazyFrame) -> None:
        names = set(batch.collect_schema().names())
        part, rank_part = pl.collect_all(
            [
                batch.group_by("step").agg(self._aggregates(names)),
                batch.group_by("rank").agg(pl.col("step").min().alias("first"), pl.col("step").max().alias("last")),
            ]
        )
        if self.per_step is None:
            self.per_step = part
        else:
            both = pl.concat([self.per_step, part], how="diagonal_relaxed")  # a column one lacks: null there
            self.per_step = both.group_by("step").agg(self._folds(both.columns))
        self.ranks.append(rank_part)

    def triage(self) -> Triage:
        assert self.per_step is not None
        per_step = self.per_step.sort("step")
        per_rank = (
            pl.concat(self.ranks, how="vertical_relaxed")
            .group_by("rank")
            .agg(pl.col("first").min(), pl.col("last").max())
            .sort("rank")
        )
        return _found(per_step, per_rank, self.shared)


def triage(batches: list[pl.LazyFrame]) -> Triage:
    """The first pass over the cache's parts, a batch at a time (Tally)."""
    tally = Tally(batches[0].collect_schema())
    for lf in batches:
        tally.add(lf)
    return tally.triage()


def _found(per_step: pl.DataFrame, per_rank: pl.DataFrame, shared: list[str]) -> Triage:
    """The steps that matter, from the per-step and per-rank aggregates."""
    steps = per_step["step"].to_list()
    checked = per_step.filter(pl.col("_checked") > 0)["step"].to_list() if "_checked" in per_step.columns else []
    out = Triage(steps=steps, checked=checked, ranks=per_rank.height, ends=per_rank)
    if not steps:
        return out
    if len(checked) > 1:
        gaps = sorted(b - a for a, b in zip(checked, checked[1:], strict=False))
        out.window = max(MIN_WINDOW, 3 * gaps[len(gaps) // 2])

    def first(mask: pl.Expr) -> list[int]:
        return per_step.filter(mask)["step"].head(MAX_CENTRES).to_list()

    out.centres["first and last steps"] = [steps[0], steps[-1]]
    for i, name in enumerate(shared):
        if f"_lo{i}" not in per_step.columns:  # null in every record
            continue
        parted = first(pl.col(f"_lo{i}") != pl.col(f"_hi{i}"))
        if parted:
            out.centres[f"ranks disagree on {name}"] = parted[:1]
    n_max = per_step["_n"].max()
    missing = first(pl.col("_n") < n_max)
    if missing:
        out.centres["a rank without the step"] = missing[:1]
    if "_nonfinite" in per_step.columns:
        nonfinite = first(pl.col("_nonfinite") > 0)
        if nonfinite:
            out.centres["a loss not finite"] = nonfinite[:1]
    lasts = sorted(set(per_rank["last"].to_list()))
    firsts = sorted(set(per_rank["first"].to_list()))
    out.centres["a rank's last step"] = sorted(set(lasts[:MAX_CENTRES] + lasts[-1:]))
    if len(firsts) > 1:
        out.centres["a rank's first step"] = firsts[:MAX_CENTRES]
    return out


def choose_steps(found: Triage, rows: int) -> tuple[list[int], int]:
    """The steps every rank's records are read at: the windows around the steps that
    matter, then evenly spaced ones (half among the check steps) up to ``rows`` records.
    Also the spacing of the latter, in steps written."""
    steps = found.steps
    if not steps:
        return [], 1
    import bisect

    chosen: set[int] = set()
    for centres in found.centres.values():
        for c in centres:
            lo = bisect.bisect_left(steps, c - found.window)
            hi = bisect.bisect_right(steps, c + found.window)
            chosen.update(steps[lo:hi])
    room = max(0, rows // max(1, found.ranks) - len(chosen))
    stride = 1
    if room:
        for pool, share in ((found.checked, room // 2), (steps, room - room // 2)):
            if pool and share:
                every = max(1, -(-len(pool) // share))
                stride = max(stride, every if pool is steps else 1)
                chosen.update(pool[::every])
    return sorted(chosen), stride


def read_bounded(
    batches: list[pl.LazyFrame], total: int, rows: int, found: Triage | None = None
) -> tuple[pl.DataFrame, str]:
    """The model's step frame (sorted by rank, then step) and the warning that says
    what it holds. ``batches``: the cached step series (records/cache.py), rank by rank,
    in batches of parts read one at a time; ``found``: their triage, where the cache
    kept it (else it is made here, a first pass over them)."""
    if found is None:
        found = triage(batches)
    chosen, stride = choose_steps(found, rows)
    # every rank's first and last record too, wherever they are: its step count and end
    # are exact (a rank that stopped early among ranks that did not)
    # The scan's filter is on the step alone, so that the Parquet reader applies it as it
    # decodes (a filter on a join with the ends decoded and copied every row of a batch):
    # the chosen steps and every rank's first and last. The few rows at another rank's
    # first or last step go after, on the small frame.
    edges = set(found.ends["first"].to_list()) | set(found.ends["last"].to_list())
    scanned = pl.Series(sorted(set(chosen) | edges), dtype=pl.Int64).implode()
    wanted = pl.Series(chosen, dtype=pl.Int64).implode()
    frame = pl.concat([lf.filter(pl.col("step").is_in(scanned)).collect() for lf in batches], rechunk=True)
    # (one chunk, not one a part: the rules' queries run over it many times)
    if edges - set(chosen):
        ends = found.ends.select("rank", pl.col("first").alias("_first"), pl.col("last").alias("_last"))
        frame = (
            frame.join(ends, on="rank", how="left", maintain_order="left")
            .filter(
                pl.col("step").is_in(wanted)
                | (pl.col("step") == pl.col("_first"))
                | (pl.col("step") == pl.col("_last"))
            )
            .drop("_first", "_last")
        )
    # The cache is sorted by rank, then step, and the filter keeps its order: sorting
    # again (a second of a big frame) only where that did not hold.
    if not (
        frame["rank"].is_sorted() and frame.select((pl.col("step").diff().over("rank") > 0).all()).item() is not False
    ):
        frame = frame.sort(["rank", "step"], maintain_order=True)
    why = "; ".join(f"{name} {', '.join(map(str, steps))}" for name, steps in found.centres.items())
    note = (
        f"a big run ({total:,} step records of {found.ranks:,} ranks over {len(found.steps):,} steps): the "
        f"rules read {frame.height:,} of them, every rank's records at {len(chosen):,} steps: every step "
        f"within {found.window} of the steps that matter ({why}) and about every {stride}th step elsewhere "
        f"({FULL_DETAIL_ENV}=0 reads them all)"
    )
    return frame, note

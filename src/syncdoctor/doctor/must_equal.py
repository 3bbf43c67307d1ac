"""Values that must be equal on every rank, compared at the same step from the logs.

In healthy data parallelism every rank holds the same learning rate, weight decay,
momentum, loss scale and update/epoch counters at a given step (the local loss and
the local gradient norm are not). A log prints many of these, under many names;
ingest/values.py reads every key -> number pair of every line. Two sources of keys:

* by meaning: the key's name says it is a hyperparameter of the optimizer, the
  loss scale, or an update counter (``KIND_OF``);
* learned from the log itself: any other key (not one that is local by name, such
  as losses, norms, timings, throughput) that every rank printed alike at
  ``LEARN_STEPS`` steps or more, with at least two different values over time
  (so it follows a shared schedule, not a constant), and then parts.

The first step at which a key parts across ranks is the finding, with both values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

LEARN_STEPS = 5
REL_TOL = 1e-9

_OPTIM = re.compile(
    r"^(?:(?:cur|current|base|group|param_group|pg)_?)?(?:lr|learning_rate|learningrate)(?:_?\d+)?$"
    r"|_lr$|^lr_|^(?:weight_decay|wd|momentum|beta1|beta2|betas?|dampening)$"
)
_SCALE = re.compile(r"^(?:loss_?scale|grad_?scale|scale|scaler_?scale|cur_scale|loss_scaler)$|(?:loss|grad)_scale")
_COUNTER = re.compile(
    r"^(?:num_updates|updates?|global_step|optimizer_steps?|opt_steps?|update_steps?|epoch|cur_epoch|"
    r"consumed_samples|consumed_tokens|skipped(?:_steps|_iters)?|micro_steps?|accum(?:ulation)?_steps?)$"
)
# Local to each rank by their name: never learned as shared.
_LOCAL = re.compile(
    r"loss|norm|acc|prec|recall|f1|ppl|perplex|nll|time|wall|eta|speed|throughput|tflops|flops|mem|"
    r"per_s|per_sec|it_s|wps|ups|wpb|samples|tokens|rank|worker|pid|device|gpu|grad|"
    r"counter_total|_total$|reward|score|entropy|kl|mse|mae|error|err|ratio|rate$",
)
# Keys that number the step a line was printed at: the index of the comparison.
_INDEX = {"step", "steps", "train_step", "iteration", "iter", "it", "global_step", "counter"}

KINDS = ("optim", "scale", "counter", "learned", "size")


@dataclass
class Parting:
    """The first step at which one key's value differs across ranks."""

    kind: str  # optim | scale | counter | learned | size (the job's size, at start)
    key: str
    step: int
    values: dict[int, float]
    agreed_steps: int  # steps compared before it where every rank agreed
    source: str = ""
    line: int | None = None
    all_keys: list[str] = field(default_factory=list)  # other keys of the same kind parting at this step

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}" if self.source and self.line is not None else self.source


def kind_of(key: str) -> str | None:
    if _SCALE.search(key):
        return "scale"
    if _OPTIM.search(key):
        return "optim"
    if _COUNTER.search(key):
        return "counter"
    return None


# What every rank prints once at start that must be the same everywhere: the
# optimizer's settings (by KIND_OF) and the size of the job.
_START_SIZE = re.compile(r"^(?:world_size|num_processes|num_gpus|nprocs?|n_gpus|ngpus|total_gpus|world)$")


def start_partings(values: pl.DataFrame) -> dict[str, Parting]:
    """Values printed before any step (no step on their line) whose first value
    differs across ranks: {"optim" or "size": Parting at step 0}."""
    frame = values.filter(pl.col("rank").is_not_null() & pl.col("step").is_null() & pl.col("value").is_finite())
    if frame.is_empty() or frame["rank"].n_unique() < 2:
        return {}
    first = frame.sort("line").unique(["rank", "key"], keep="first", maintain_order=True)
    found: dict[str, Parting] = {}
    for (key,), group in first.group_by(["key"], maintain_order=True):
        key = str(key)
        kind = "size" if _START_SIZE.search(key) else kind_of(key)
        if kind not in ("optim", "size") or group.height < 2:
            continue
        lo, hi = group["value"].min(), group["value"].max()
        if not isinstance(lo, float) or not isinstance(hi, float) or hi - lo <= REL_TOL * max(abs(hi), abs(lo)):
            continue
        group = group.sort("rank")
        if kind not in found:
            found[kind] = Parting(
                kind=kind,
                key=key,
                step=0,
                values={int(r): float(v) for r, v in zip(group["rank"], group["value"], strict=True)},
                agreed_steps=0,
                source=str(group["source"][0]),
                line=int(group["line"][0]),
            )
        else:
            found[kind].all_keys.append(key)
    return found


def partings(values: pl.DataFrame) -> dict[str, Parting]:
    """The first parting of each kind (earliest step; then the first key in the line);
    what differs already at start (``start_partings``) comes first."""
    if not values.height:
        return {}
    at_start = start_partings(values)
    found = _step_partings(values)
    for kind, p in at_start.items():
        found[kind if kind != "size" else "size"] = p
    return found


def _step_partings(values: pl.DataFrame) -> dict[str, Parting]:
    frame = (
        values.filter(
            pl.col("rank").is_not_null()
            & pl.col("step").is_not_null()
            & pl.col("value").is_finite()
            & ~pl.col("key").is_in(list(_INDEX))
        )
        .sort("line")
        .unique(["rank", "step", "key"], keep="first", maintain_order=True)
    )
    if frame.is_empty() or frame["rank"].n_unique() < 2:
        return {}
    per = (
        frame.group_by(["key", "step"])
        .agg(
            pl.len().alias("n"),
            pl.col("value").min().alias("lo"),
            pl.col("value").max().alias("hi"),
        )
        .filter(pl.col("n") > 1)
        .with_columns(
            ((pl.col("hi") - pl.col("lo")) > REL_TOL * pl.max_horizontal(pl.col("hi").abs(), pl.col("lo").abs())).alias(
                "parted"
            )
        )
        .sort("key", "step")
    )
    found: dict[str, Parting] = {}
    for (key,), group in per.group_by(["key"], maintain_order=True):
        key = str(key)
        kind = kind_of(key)
        parted = group["parted"].to_list()
        if True not in parted:
            continue
        first = parted.index(True)
        if kind is None:
            if _LOCAL.search(key) or first < LEARN_STEPS:
                continue
            lows = group["lo"].head(first)
            if lows.n_unique() < 2:
                continue  # a constant that happened to match: not a shared schedule
            kind = "learned"
        step = int(group["step"][first])
        at = frame.filter((pl.col("key") == key) & (pl.col("step") == step)).sort("rank")
        parting = Parting(
            kind=kind,
            key=key,
            step=step,
            values={int(r): float(v) for r, v in zip(at["rank"], at["value"], strict=True)},
            agreed_steps=first,
            source=str(at["source"][0]),
            line=int(at["line"][0]),
        )
        best = found.get(kind)
        if best is None or (parting.step, parting.line or 0) < (best.step, best.line or 0):
            if best is not None and best.step == parting.step:
                parting.all_keys = [*best.all_keys, best.key]
            found[kind] = parting
        elif best.step == parting.step:
            best.all_keys.append(key)
    return found


def describe(p: Parting, split: Any) -> str:
    """`lr at step 142: 0.00016 (rank 0) vs 0.1 (rank 1)`, with what came before."""
    before = f", equal on every rank at the {p.agreed_steps} steps compared before" if p.agreed_steps else ""
    others = f" (also {', '.join(p.all_keys[:4])})" if p.all_keys else ""
    when = f"at step {p.step}" if p.step else "at start (printed once, before any step)"
    return f"`{p.key}` {when}: {split(p.values)}{before}{others}"


# Keys whose presence says who prints, not what the step did.
_WHO = re.compile(r"rank|worker|pid|device|gpu|host|node|counter|_total$")
PRESENT = 0.8  # a key a rank prints on this share of its step lines, or more


@dataclass
class RankOnlyKey:
    """A key some ranks print on every step line and the others never do."""

    key: str
    printing: list[int]
    silent: list[int]
    steps: int  # shared steps compared
    anchor: str  # a key every rank prints on the same lines
    first_step: int


def rank_only_keys(values: pl.DataFrame) -> list[RankOnlyKey]:
    """Keys that some ranks add to the step line every rank prints, at the same
    steps, and that the other ranks never print: the ranks ran different code at
    each step (a rank-conditional branch)."""
    if not values.height:
        return []
    frame = values.filter(pl.col("rank").is_not_null() & pl.col("step").is_not_null())
    ranks = sorted(frame["rank"].unique().to_list())
    if len(ranks) < 2:
        return []
    per_rank_steps = frame.group_by("rank").agg(pl.col("step").unique())
    shared = set.intersection(*(set(s) for s in per_rank_steps["step"].to_list()))
    if len(shared) < LEARN_STEPS:
        return []
    frame = frame.filter(pl.col("step").is_in(list(shared)))
    n = len(shared)
    # the share of shared steps at which each rank prints each key
    share = frame.group_by(["rank", "key"]).agg((pl.col("step").n_unique() / n).alias("share"))
    table: dict[str, dict[int, float]] = {}
    for rank, key, s in share.iter_rows():
        table.setdefault(str(key), {})[int(rank)] = float(s)
    anchors = [k for k, per in table.items() if len(per) == len(ranks) and min(per.values()) >= PRESENT]
    if not anchors:
        return []
    anchor = "loss" if "loss" in anchors else sorted(anchors)[0]
    anchor_lines = frame.filter(pl.col("key") == anchor).select("rank", "line", "source")
    on_anchor_lines = frame.join(anchor_lines, on=["rank", "line", "source"], how="semi")
    found = []
    for key, per in sorted(table.items()):
        if _WHO.search(key) or key in _INDEX or len(per) == len(ranks):
            continue
        printing = sorted(r for r, s in per.items() if s >= PRESENT)
        if not printing or len(per) != len(printing):
            continue  # printed now and then: not a branch taken at every step
        rows = on_anchor_lines.filter(pl.col("key") == key)
        if rows["step"].n_unique() < PRESENT * n:
            continue  # on lines of its own, not on the step line every rank prints
        found.append(
            RankOnlyKey(
                key=key,
                printing=printing,
                silent=[r for r in ranks if r not in per],
                steps=n,
                anchor=anchor,
                first_step=int(rows["step"].cast(pl.Int64).min() or 0),
            )
        )
    return found

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

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
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

KINDS = ("optim", "scale", "counter", "learned", "size", "seed")


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
# A seed printed at start: the model's initialisation and the shuffle of sharded data
# need the same seed on every rank (augmentation may take one of its own).
_START_SEED = re.compile(r"^(?:(?!(?:worker|aug|augment|augmentation|dropout|noise|local|rank)_)[a-z]+_)?seed$")


def start_partings(values: pl.DataFrame) -> dict[str, Parting]:
    """Values printed before any step (no step on their line) whose first value
    differs across ranks: {"optim", "size" or "seed": Parting at step 0}."""
    frame = values.filter(pl.col("rank").is_not_null() & pl.col("step").is_null() & pl.col("value").is_finite())
    if frame.is_empty() or frame["rank"].n_unique() < 2:
        return {}
    first = frame.sort("line").unique(["rank", "key"], keep="first", maintain_order=True)
    found: dict[str, Parting] = {}
    for (key,), group in first.group_by(["key"], maintain_order=True):
        key = str(key)
        kind = "size" if _START_SIZE.search(key) else "seed" if _START_SEED.search(key) else kind_of(key)
        if kind not in ("optim", "size", "seed") or group.height < 2:
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


# ---------------------------------------------------------------- what every rank evaluated
# An evaluation every rank runs on the same data after training (a final accuracy,
# perplexity, validation loss) comes out equal on replicas that are equal: the
# printed values agree to the last digit, or within what nondeterministic kernels
# move them (far below EVAL_TOL). Local training values (the loss of the last
# batch, throughput, time) are not evaluations.
EVAL_TOL = 0.01
_METRIC = re.compile(
    r"^(?:(?:val|valid|validation|eval|evaluation|test|dev|final|best)_?)?"
    r"(?:acc|accuracy|top_?[15](?:_acc)?|f1|auc|ppl|perplexity|bleu|rouge\w*|map|miou|iou|dice|wer|cer|"
    r"precision|recall|mae|mse|rmse|error_rate)$"
)
_EVAL_LOSS = re.compile(r"^(?:val|valid|validation|eval|evaluation|test|dev)_?(?:loss|nll|ppl)$")


@dataclass
class EvalParting:
    """An evaluation every rank printed after its last training line, differing."""

    key: str
    values: dict[int, float]
    spread: float  # (max - min) / max(|max|, |min|)
    source: str
    line: int


def is_evaluation(key: str) -> bool:
    return bool(_METRIC.search(key) or _EVAL_LOSS.search(key))


def final_evaluations(values: pl.DataFrame, losses: pl.DataFrame) -> list[EvalParting]:
    """Evaluations each rank printed after its last training-loss line (the values
    of a file's last lines, ingest/core.py), compared across ranks: those that
    differ by more than EVAL_TOL, largest spread first."""
    if not values.height or not losses.height or "source" not in losses.columns:
        return []
    last = losses.filter(pl.col("line").is_not_null()).group_by("source").agg(pl.col("line").max().alias("last"))
    frame = (
        values.filter(pl.col("rank").is_not_null() & pl.col("value").is_finite())
        .join(last, on="source", how="inner")
        .filter(pl.col("line") > pl.col("last"))
    )
    if frame.is_empty() or frame["rank"].n_unique() < 2:
        return []
    frame = frame.filter(pl.col("key").is_in([k for k in frame["key"].unique().to_list() if is_evaluation(k)]))
    if frame.is_empty():
        return []
    final = frame.sort("line").unique(["rank", "key"], keep="last", maintain_order=True)
    ranks = frame["rank"].n_unique()
    found = []
    for (key,), group in final.group_by(["key"], maintain_order=True):
        if group.height < max(2, ranks):
            continue  # not printed by every rank that evaluated
        column = group["value"].to_list()
        lo, hi = float(min(column)), float(max(column))
        scale = max(abs(lo), abs(hi))
        spread = (hi - lo) / scale if scale > 0 else 0.0
        if spread <= EVAL_TOL:
            continue
        group = group.sort("rank")
        found.append(
            EvalParting(
                key=str(key),
                values={int(r): float(v) for r, v in zip(group["rank"], group["value"], strict=True)},
                spread=spread,
                source=str(group["source"][0]),
                line=int(group["line"][0]),
            )
        )
    return sorted(found, key=lambda p: -p.spread)


# ---------------------------------------------------------------- losses drifting apart
# Equal replicas on shards of the same data: each rank's loss scatters around the
# same-step mean of all ranks with no trend. Replicas that receive different updates
# (a learning rate, weight decay or momentum of their own) drift apart: a rank's gap
# to the others starts within that scatter and grows. Replicas that started apart and
# receive the same averaged update keep the same distance in weight space: the gap
# shows no such trend.
DRIFT_T = 4.0  # the late gap against the early one, in standard errors
DRIFT_MIN = 0.1  # the late gap: at least 10 % of the loss
DRIFT_MIN_STEPS = 12


@dataclass
class Drift:
    """How each rank's relative loss gap to the same-step mean moved from the first
    quarter of the shared steps to the last."""

    early: dict[int, float]
    late: dict[int, float]
    t: dict[int, float]
    steps: tuple[int, int, int, int]  # first/last step of the early and of the late quarter

    @property
    def drifting(self) -> list[int]:
        return sorted(
            r
            for r, t in self.t.items()
            if abs(t) > DRIFT_T and abs(self.late[r]) > DRIFT_MIN and abs(self.late[r]) > 3 * abs(self.early[r])
        )


def loss_drift(wide: pl.DataFrame) -> Drift | None:
    """The loss gaps' trend from a step x rank table of losses (steps every rank printed)."""
    cols = [c for c in wide.columns if c != "step"]
    if wide.height < DRIFT_MIN_STEPS or len(cols) < 2:
        return None
    values = wide.select(cols).to_numpy().astype(float)
    if not np.isfinite(values).all():
        return None
    mean = values.mean(axis=1, keepdims=True)
    rel = (values - mean) / np.clip(np.abs(mean), 1e-12, None)
    q = max(4, wide.height // 4)
    steps = wide["step"].to_list()
    early, late, t = {}, {}, {}
    for i, c in enumerate(cols):
        a, b = rel[:q, i], rel[-q:, i]
        se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
        diff = float(b.mean() - a.mean())
        early[int(c)], late[int(c)] = float(a.mean()), float(b.mean())
        t[int(c)] = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(1e9, diff))
    return Drift(early, late, t, (int(steps[0]), int(steps[q - 1]), int(steps[-q]), int(steps[-1])))

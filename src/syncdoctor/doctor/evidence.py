"""Everything the rules look at, computed once from probe records and raw logs.

Each analysis is a cached property, so a rule that needs nothing from records costs
nothing on a logs-only diagnosis, and 256 ranks × 10,000 steps stay columnar
(polars) from file to finding.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

import numpy as np
import polars as pl

from syncdoctor.doctor.model import Event, LossShape
from syncdoctor.doctor.shape import classify
from syncdoctor.records import RunRecords, contract
from syncdoctor.records.compare import majority_outliers
from syncdoctor.records.reader import MAX_WORLD_SIZE

# Fingerprints that healthy data parallelism keeps bitwise equal across ranks.
INVARIANTS = ("param_fp", "opt_fp", "grad_fp")
COUNTERS = ("micro", "backward", "opt_steps")
# What must be configured alike (loss, optimizer, DDP settings), fingerprinted each step.
CONFIG = ("config_fp",)
FAILURE_KINDS = ("crash", "oom")


@dataclass
class Divergence:
    """The first step at which replicas stopped being identical."""

    step: int
    ranks: list[int]
    what: list[str]  # param, opt, grad, buffer, counter, mode, data
    tensor: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    # The last check before `step` at which every rank's parameters agreed: the
    # replicas parted somewhere in (last_agree_step, step]. None: no such check.
    last_agree_step: int | None = None


@dataclass
class Offsets:
    """Persistent per-rank loss offsets against the same-step mean of all ranks.

    Judged in windows of consecutive steps: while the loss is large, a different
    loss definition shifts a rank's loss by a steady fraction; later, mini-batch
    noise of small losses drowns it. Healthy ranks on different data scatter
    around the mean with either sign."""

    by_rank: dict[int, float]  # mean relative offset in the rank's strongest window
    t_stat: dict[int, float]  # its t statistic
    same_sign: dict[int, float]  # fraction of that window's steps on the same side
    window: dict[int, tuple[int, int]]  # (first step, last step)
    spread: float  # median same-step relative spread


OFFSET_WINDOW = 20
SAME_DATA_MIN_CORR = 0.3


# polars types a column's min, max, mean and median as any Python literal; on the numeric
# columns the doctor aggregates (step, rank, loss, ratios) it is a number: these say so.
def int_of(value: object) -> int:
    return int(cast(int, value))


def float_of(value: object) -> float:
    return float(cast(float, value))


def _rolling_median(x: np.ndarray, k: int) -> np.ndarray:
    padded = np.pad(x, (k // 2, k // 2), mode="edge")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, k), axis=1)


class Evidence:
    def __init__(self, records: RunRecords | None = None, logs: Any = None, warnings: list[str] | None = None) -> None:
        self.records = records
        self.logs = logs
        self.warnings = list(warnings or [])
        # Set by `diagnose --baseline`: the comparison with a baseline run (doctor/baseline.py).
        self.baseline: Any = None
        if records is not None:
            self.warnings += records.warnings
        if logs is not None:
            self.warnings += list(logs.warnings)

    # ------------------------------------------------------------------ basics
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
    def loss_wide(self) -> pl.DataFrame:
        """step × rank table of losses, only steps every rank reported."""
        if not self.losses.height:
            return pl.DataFrame()
        wide = self.losses.pivot(on="rank", index="step", values="loss", aggregate_function="first")
        return wide.drop_nulls().sort("step")

    # ------------------------------------------------------------------ loss curves
    @cached_property
    def rank_shapes(self) -> list[LossShape]:
        out = []
        for (rank,), part in self.losses.group_by(["rank"], maintain_order=True):
            out.append(classify(part["loss"].to_list(), part["step"].to_list(), rank=int(rank)))
        return sorted(out, key=lambda s: s.rank if s.rank is not None else -1)

    @cached_property
    def mean_shape(self) -> LossShape | None:
        if not self.losses.height:
            return None
        mean = self.losses.group_by("step").agg(pl.col("loss").mean()).sort("step")
        return classify(mean["loss"].to_list(), mean["step"].to_list(), rank=None)

    @cached_property
    def offsets(self) -> Offsets | None:
        wide = self.loss_wide
        if wide.height < OFFSET_WINDOW or wide.width < 3:
            return None
        cols = [c for c in wide.columns if c != "step"]
        values = wide.select(cols)
        mean = values.mean_horizontal()
        rel = values.select([((pl.col(c) - mean) / mean.abs().clip(lower_bound=1e-12)).alias(c) for c in cols])
        steps = wide["step"].to_numpy()
        by_rank, t_stat, same_sign, window = {}, {}, {}, {}
        for c in cols:
            series = rel[c].to_numpy()
            best = (0.0, 0.0, 0.0, 0)
            for start in range(0, len(series) - OFFSET_WINDOW + 1, OFFSET_WINDOW // 2):
                chunk = series[start : start + OFFSET_WINDOW]
                mu, sd = float(chunk.mean()), float(chunk.std(ddof=1))
                t = mu / (sd / math.sqrt(len(chunk))) if sd > 0 else (0.0 if mu == 0 else math.copysign(1e9, mu))
                if abs(t) > abs(best[1]):
                    best = (mu, t, float((np.sign(chunk) == np.sign(mu)).mean()), start)
            rank = int(c)
            by_rank[rank], t_stat[rank], same_sign[rank] = best[0], best[1], best[2]
            window[rank] = (int(steps[best[3]]), int(steps[min(len(steps) - 1, best[3] + OFFSET_WINDOW - 1)]))
        spread = float_of(rel.select(pl.max_horizontal(cols) - pl.min_horizontal(cols)).to_series().median() or 0.0)
        return Offsets(by_rank, t_stat, same_sign, window, spread)

    @cached_property
    def same_data_groups(self) -> list[list[int]]:
        """Groups of ranks whose per-step losses move together far beyond chance:
        they read the same batches (dropout and other per-rank noise keep the losses
        from being identical). Residuals around the common trend of ranks on
        different data are uncorrelated."""
        wide = self.loss_wide
        if wide.height < 30 or wide.width < 3:
            return []
        if self.mean_shape is None or self.mean_shape.shape != "decreasing":
            return []  # large, erratic updates move every rank's loss together too
        cols = [c for c in wide.columns if c != "step"]
        values = wide.select(cols).to_numpy().T
        if not np.isfinite(values).all() or (values <= 0).any():
            values = np.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        else:
            values = np.log(values)  # multiplicative noise becomes additive
        trend = _rolling_median(values.mean(axis=0), 9)
        residual = values - trend
        if (residual.std(axis=1) == 0).any():
            identical: dict[bytes, list[int]] = {}
            for i, row in enumerate(values):
                identical.setdefault(row.tobytes(), []).append(int(cols[i]))
            return [sorted(g) for g in identical.values() if len(g) > 1]
        corr = np.corrcoef(residual)
        threshold = max(SAME_DATA_MIN_CORR, 4 / math.sqrt(values.shape[1]))
        parent = list(range(len(cols)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, j in zip(*np.nonzero(np.triu(corr > threshold, 1)), strict=True):
            parent[root(int(i))] = root(int(j))
        groups: dict[int, list[int]] = {}
        for i, c in enumerate(cols):
            groups.setdefault(root(i), []).append(int(c))
        return [sorted(g) for g in groups.values() if len(g) > 1]

    # ------------------------------------------------------------------ replicas
    @cached_property
    def divergence(self) -> Divergence | None:
        """First step where fingerprints or counters part, from the live checks and
        from the step records (whichever saw it first)."""
        candidates = []
        bad = [c for c in self.checks if c.get("status") == "mismatch" and not (c.get("detail") or {}).get("follow_up")]
        if bad:
            first = min(bad, key=lambda c: c["step"])
            tensor = next(
                (
                    c.get("tensor")
                    for c in sorted(self.checks, key=lambda c: c["step"])
                    if c.get("status") == "mismatch" and c.get("tensor")
                ),
                None,
            )
            # Any field may be null (records/contract.py): a null list is an empty one.
            candidates.append(
                Divergence(
                    first["step"],
                    list(first.get("ranks") or []),
                    list(first.get("what") or []),
                    tensor,
                    first.get("detail") or {},
                )
            )
        from_steps = self._divergence_from_steps()
        if from_steps is not None:
            if candidates and candidates[0].tensor:
                from_steps.tensor = candidates[0].tensor
            candidates.append(from_steps)
        if not candidates:
            return None
        best = min(candidates, key=lambda d: d.step)
        for other in candidates:  # merge what each source saw at the earliest step
            if other is not best and other.step == best.step:
                best.what = sorted(set(best.what) | set(other.what))
                best.ranks = sorted(set(best.ranks) | set(other.ranks))
        best.what = sorted(set(best.what) | self._parted_when_next_measured(best.step))
        if best.tensor is None and {"param", "grad"} & set(best.what):
            best.tensor = self.first_differing_tensor(best.step)
        agreed = [s for s, parted in self._agreement_per_check if not parted and s < best.step]
        best.last_agree_step = max(agreed) if agreed else None
        return best

    @cached_property
    def _agreement_per_check(self) -> list[tuple[int, list[int]]]:
        """(step, odd ranks) at every step where two or more ranks fingerprinted their
        parameters; odd as records.compare.agreement has it: outside a strict
        majority, or every rank of a split without one."""
        if not self.has_records or "param_fp" not in self.steps.columns:
            return []
        rows = self.steps.filter(pl.col("param_fp").is_not_null()).select("step", "rank", "param_fp")
        if not rows.height:
            return []
        groups = rows.group_by("step", "param_fp").agg(pl.len().alias("k"), pl.col("rank").min().alias("lo"))
        reference = (
            groups.sort(["step", "k", "lo"], descending=[False, True, False])
            .unique("step", keep="first", maintain_order=True)
            .select("step", pl.col("param_fp").alias("_ref"), pl.col("k").alias("_top"))
        )
        per_check = (
            rows.join(reference, on="step")
            .group_by("step")
            .agg(
                pl.len().alias("n"),
                pl.col("_top").first().alias("top"),
                pl.col("rank").filter(pl.col("param_fp") != pl.col("_ref")).sort().alias("odd"),
                pl.col("rank").sort().alias("all"),
            )
            .filter(pl.col("n") > 1)
            .sort("step")
        )
        return [
            (int(s), list(odd) if top * 2 > n or not odd else list(every))
            for s, n, top, odd, every in per_check.select("step", "n", "top", "odd", "all").iter_rows()
        ]

    @cached_property
    def agreement(self) -> list[dict[str, Any]]:
        """The replica-agreement timeline: runs of consecutive parameter checks with
        the same outcome, as dicts of AgreementSpan's fields."""
        per_check = self._agreement_per_check
        if not per_check:
            return []
        reporting = (
            self.steps.filter(pl.col("param_fp").is_not_null()).group_by("step").agg(pl.col("rank").sort()).sort("step")
        )
        ranks_at = dict(zip(reporting["step"].to_list(), reporting["rank"].to_list(), strict=True))
        expected = set(range(self.world_size)) if self.world_size else set(self.ranks)
        mismatches: dict[int, dict[str, Any]] = {}
        for c in self.checks:
            if c.get("status") == "mismatch" and isinstance(c.get("step"), int):
                mismatches.setdefault(c["step"], c)
        spans: list[dict[str, Any]] = []
        for step, parted in per_check:
            present = ranks_at.get(step, [])
            missing = sorted(expected - set(present)) if len(present) < len(expected) else []
            key = (tuple(parted), tuple(missing))
            last = spans[-1] if spans else None
            if last is None or last["_key"] != key:
                last = {
                    "_key": key,
                    "first_step": step,
                    "last_step": step,
                    "checks": 0,
                    "ranks": len(present),
                    "parted": parted,
                    "missing": missing,
                    "what": [],
                    "tensor": None,
                    "no_majority": bool(parted) and len(parted) * 2 >= len(present),
                }
                spans.append(last)
            last["last_step"] = step
            last["checks"] += 1
        for span in spans:
            seen = [c for s, c in mismatches.items() if span["first_step"] <= s <= span["last_step"]]
            span["what"] = sorted({w for c in seen for w in c.get("what") or [] if isinstance(w, str)})
            span["tensor"] = next((c.get("tensor") for c in seen if c.get("tensor")), None)
            if span["parted"] and not span["what"]:
                span["what"] = ["param"]
            del span["_key"]
        return spans

    def _parted_when_next_measured(self, step: int) -> set[str]:
        """Reduced gradients and optimizer state are fingerprinted less often than the
        parameters: whether they too had parted is read at the first step, from the
        divergence on, where they were measured. Not measured is not "equal"."""
        if not self.has_records:
            return set()
        parted = set()
        for kind in ("grad", "opt"):
            first_measured = self._first_measured(kind, step)
            if first_measured is not None and self._first_disagreement(kind, first_measured, first_measured):
                parted.add(kind)
        return parted

    def _divergence_from_steps(self) -> Divergence | None:
        steps = self.steps
        if not self.has_records or steps["rank"].n_unique() < 2:
            return None
        found: list[tuple[int, str, list[int], list[dict[str, Any]]]] = []
        for kind in ("param", "opt", "grad"):
            parted = self._first_disagreement(kind)
            if parted is not None:
                found.append((parted[0], kind, parted[1], parted[2]))
        for what, columns in (("counter", COUNTERS), ("config", CONFIG)):
            parted_at = self._first_step_differing(columns)
            if parted_at is not None:
                found.append((parted_at[0], what, parted_at[1], []))
        if not found:
            return None
        step = min(f[0] for f in found)
        first = [f for f in found if f[0] == step]
        detail: dict[str, Any] = {}
        merged: dict[tuple[int, tuple[int, ...]], dict[str, Any]] = {}
        for group in (g for f in first for g in f[3]) if self.replica else ():
            key = (group["class"], tuple(group["members"]))
            if key in merged:
                merged[key]["what"] = sorted(set(merged[key]["what"]) | set(group["what"]))
                merged[key]["odd"] = sorted(set(merged[key]["odd"]) | set(group["odd"]))
            else:
                merged[key] = dict(group)
        if merged:
            detail["groups"] = list(merged.values())
        return Divergence(step, sorted({r for f in first for r in f[2]}), sorted({f[1] for f in first}), detail=detail)

    def _first_step_differing(self, columns: tuple[str, ...]) -> tuple[int, list[int]] | None:
        """The first step at which ranks wrote different values in any of `columns`
        (values every rank must share), and the ranks outside the majority there."""
        steps = self.steps
        cols = [c for c in columns if c in steps.columns]
        if not cols:
            return None
        per_step = (
            steps.group_by("step")
            .agg([pl.col(c).drop_nulls().n_unique().alias(c) for c in cols] + [pl.len().alias("n")])
            .filter(pl.col("n") > 1)
            .sort("step")
        )
        differing = per_step.filter(pl.any_horizontal([pl.col(c) > 1 for c in cols]))
        if not differing.height:
            return None
        step = int(differing["step"][0])
        row = differing.row(0, named=True)
        at = steps.filter(pl.col("step") == step)
        ranks: set[int] = set()
        for c in cols:
            if row[c] > 1:
                values = {int(r): v for r, v in zip(at["rank"], at[c], strict=True) if v is not None}
                ranks.update(majority_outliers(values))
        return step, sorted(ranks)

    def first_differing_tensor(self, step: int) -> str | None:
        """The first parameter whose per-tensor record differs across ranks at `step`:
        its fingerprint (tensor_fps) or its reduced gradient's norm (tensor_norms),
        named from the snapshot's `tensors`. None when no such record was written."""
        if not self.has_records or self.replica:  # sharded tensors differ across ranks by design
            return None
        names = next((t for t in self.snapshot_values("tensors").values() if isinstance(t, list)), None)
        at = self.steps.filter(pl.col("step") == step)
        for column in ("tensor_fps", "tensor_norms"):
            rows = [v for v in at[column].to_list() if isinstance(v, list)] if column in at.columns else []
            if len(rows) < 2:
                continue
            for index, values in enumerate(zip(*rows, strict=False)):
                if len(set(values)) > 1:
                    return str(names[index]) if names and index < len(names) else f"parameter #{index}"
        return None

    # ------------------------------------------------------------------ replica groups
    @cached_property
    def replica(self) -> dict[int, dict[str, Any]]:
        """Per rank, the placement classes and replica keys of a sharded/hybrid job
        (probe/torch/mesh.py); empty under plain data parallelism."""
        return {r: snap["replica"] for r, snap in self.snapshots.items() if isinstance(snap.get("replica"), dict)}

    @cached_property
    def mesh(self) -> dict[str, Any] | None:
        """The device mesh of a sharded/hybrid job (shape, dimension names, ranks)."""
        return next((info.get("mesh") for info in self.replica.values() if info.get("mesh")), None)

    @cached_property
    def _fps_by_kind(self) -> dict[str, pl.DataFrame]:
        return {kind: self._build_long_fps(kind) for kind in ("param", "opt", "grad")}

    def _long_fps(self, kind: str) -> pl.DataFrame:
        return self._fps_by_kind[kind]  # built once: the divergence and agree_after read it often

    @cached_property
    def opt_state_replicated(self) -> bool:
        """False when some rank's optimizer holds only its own part of the state
        (ZeRO): its fingerprint then differs across ranks by design."""
        return all(v is not False for v in self.snapshot_values("optimizer", "state_replicated").values())

    def _build_long_fps(self, kind: str) -> pl.DataFrame:
        """rank, step, class, key, value: the fingerprints of `kind` (param, opt, grad)
        per placement class, with the replica key each rank holds for it. Under plain
        data parallelism: one class whose key is the same on every rank."""
        steps = self.steps
        if kind == "opt" and not self.opt_state_replicated:
            return pl.DataFrame()  # sharded optimizer state is no replica: nothing to compare
        if not self.replica:
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
            [(r, c, int(k)) for r, info in self.replica.items() for c, k in enumerate(info.get("keys") or [])],
            schema={"rank": pl.Int64, "class": pl.Int64, "key": pl.Int64},
            orient="row",
        )
        return values.join(keys, on=["rank", "class"])

    def agree_after(self, kind: str, step: int) -> bool | None:
        """Whether `kind` (grad, opt) agreed within every replica group where it was
        first measured at or after `step`; None when it was not measured since."""
        first = self._first_measured(kind, step)
        if first is None:
            return None
        return self._first_disagreement(kind, first, first) is None

    def _first_measured(self, kind: str, step: int) -> int | None:
        frame = self._long_fps(kind)
        later = frame.filter(pl.col("step") >= step) if frame.height else frame
        return int_of(later["step"].min()) if later.height else None

    def _first_disagreement(
        self, kind: str, start: int | None = None, end: int | None = None
    ) -> tuple[int, list[int], list[dict[str, Any]]] | None:
        """The first step (in [start, end]) where ranks that must hold the same `kind`
        do not: (step, the odd ranks, the replica groups that parted there)."""
        frame = self._long_fps(kind)
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
        classes = next(iter(self.replica.values())).get("classes") if self.replica else None
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

    @cached_property
    def counter_table(self) -> dict[str, dict[int, Any]]:
        """Counters per rank at the divergence step (or the last common step)."""
        if not self.has_records:
            return {}
        div = self.divergence
        step = div.step if div else int_of(self.steps["step"].max())
        at = self.steps.filter(pl.col("step") == step)
        return {c: dict(zip(at["rank"].to_list(), at[c].to_list(), strict=True)) for c in COUNTERS if c in at.columns}

    @cached_property
    def micro_by_rank(self) -> dict[int, int]:
        """Typical micro-steps per update on each rank (the mode)."""
        if not self.has_records:
            return {}
        modes = self.steps.group_by("rank").agg(pl.col("micro").mode().first().alias("m"))
        return {int(r): int(m) for r, m in modes.iter_rows() if m is not None}

    @cached_property
    def unsynced_buffers_differ(self) -> bool:
        return any(c.get("detail", {}).get("buffers_differ_unsynced") for c in self.checks)

    @cached_property
    def first_unsynced_buffer_step(self) -> int | None:
        """The first check step at which buffers nothing keeps in sync differed."""
        if self.has_records and "buffer_fp" in self.steps.columns:
            per_step = (
                self.steps.filter(pl.col("buffer_fp").is_not_null())
                .group_by("step")
                .agg(pl.col("buffer_fp").n_unique().alias("k"))
                .filter(pl.col("k") > 1)
            )
            if per_step.height:
                return int_of(per_step["step"].min())
        # Only the live check saw it: an ok block that covers several checks says no more
        # than its last step.
        steps = [c["step"] for c in self.checks if c.get("detail", {}).get("buffers_differ_unsynced")]
        return min(steps) if steps else None

    @cached_property
    def log_partings(self) -> dict[str, Any]:
        """From the logs: the first step at which a value that must be equal on every
        rank (lr, loss scale, update counters, or a key the log shows shared) differs,
        per kind ({kind: must_equal.Parting}; doctor/must_equal.py)."""
        from syncdoctor.doctor.must_equal import partings

        values = getattr(self.logs, "values", None)
        return partings(values) if isinstance(values, pl.DataFrame) else {}

    @cached_property
    def rank_only_keys(self) -> list[Any]:
        """From the logs: keys some ranks add to the step line every rank prints and
        the others never print (must_equal.RankOnlyKey)."""
        from syncdoctor.doctor.must_equal import rank_only_keys

        values = getattr(self.logs, "values", None)
        return rank_only_keys(values) if isinstance(values, pl.DataFrame) else []

    @cached_property
    def hang_picture(self) -> dict[int, dict[str, Any]]:
        """From the logs of a job that timed out: for each rank, the last step it
        printed before its own first wait or timeout, and that first wait (or none:
        the rank never said it waited: it was busy elsewhere, or it ended).
        {rank: {"last_step", "wait", "ended"}} ("ended": the rank logged a crash, an
        out-of-memory or an exit); empty when nothing timed out or failed on the
        network, or fewer than two ranks printed steps."""
        waits = [e for e in self.events_of("timeout", "watchdog", "network") if e.rank is not None]
        if not waits or self.has_records or not self.losses.height or self.logs is None:
            return {}
        first: dict[int, Event] = {}
        for e in waits:
            best = first.get(int(e.rank))  # type: ignore[arg-type] # rank is set: filtered above
            if best is None or (e.t is not None and best.t is not None and e.t < best.t):
                first[int(e.rank)] = e  # type: ignore[arg-type]
        rows = self.logs.losses.filter(pl.col("rank").is_not_null() & pl.col("step").is_not_null())
        out: dict[int, dict[str, Any]] = {}
        for (rank,), part in rows.group_by(["rank"]):
            wait = first.get(int(rank))
            if wait is not None and wait.source in set(part["source"].to_list()) and wait.line is not None:
                part = part.filter((pl.col("source") != wait.source) | (pl.col("line") < wait.line))
            if part.height:
                ended = any(e.rank == rank for e in self.events_of("crash", "oom", "exit"))
                out[int(rank)] = {"last_step": int(part["step"].max()), "wait": wait, "ended": ended}
        return out if len(out) > 1 else {}

    @cached_property
    def hyperparameter_drift(self) -> tuple[int, dict[int, Any]] | None:
        """The first step at which the ranks' learning rates differ (a schedule or a
        manual change applied on some ranks only): (step, {rank: lr})."""
        if not self.has_records or "lr" not in self.steps.columns:
            return None
        per_step = (
            self.steps.filter(pl.col("lr").is_not_null())
            .group_by("step")
            .agg(pl.col("lr").n_unique().alias("k"), pl.len().alias("n"))
            .filter((pl.col("k") > 1) & (pl.col("n") > 1))
            .sort("step")
        )
        if not per_step.height:
            return None
        step = int(per_step["step"][0])
        at = self.steps.filter(pl.col("step") == step)
        return step, dict(zip(at["rank"].to_list(), at["lr"].to_list(), strict=True))

    @cached_property
    def incomplete_checks(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("status") == "incomplete"]

    # ------------------------------------------------------------------ reductions and numerics
    @cached_property
    def reduce_excess(self) -> dict[str, float] | None:
        """Post-reduce norm over the mean local pre-reduce norm, per step. Averaging
        can never exceed 1 (triangle inequality); a sum of aligned gradients does."""
        if not self.has_records or "grad_norm_local" not in self.steps.columns:
            return None
        rows = self.steps.filter(pl.col("grad_norm_local").is_not_null() & pl.col("grad_norm").is_not_null())
        if rows.height < 2:
            return None
        per_step = rows.group_by("step").agg(
            pl.col("grad_norm").median().alias("post"),
            pl.col("grad_norm_local").mean().alias("pre"),
            pl.len().alias("n"),
        )
        per_step = per_step.filter(pl.col("n") > 1)
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
        if not self.has_records or "reduce_ratio" not in self.steps.columns:
            return []
        rows = self.steps.filter(pl.col("reduce_ratio").is_not_null())
        div = self.divergence
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
    def overflow_disagreement(self) -> list[tuple[int, list[int]]]:
        """Steps where some ranks skipped for overflow and others did not."""
        if not self.has_records or self.steps["overflow"].null_count() == self.steps.height:
            return []
        per = (
            self.steps.filter(pl.col("overflow").is_not_null())
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
        if not self.has_records:
            return 0
        return int(self.steps["overflow"].fill_null(False).sum())

    # ------------------------------------------------------------------ data
    @cached_property
    def duplicate_batches(self) -> tuple[float, list[list[int]]]:
        """Fraction of steps where two ranks consumed identical batches, and which ranks."""
        if not self.has_records or self.steps["data_fp"].null_count() == self.steps.height:
            return 0.0, []
        rows = self.steps.filter(pl.col("data_fp").is_not_null())
        if self.replica:
            # Ranks of one data shard (tensor-parallel peers) read the same batch by design.
            keys = pl.DataFrame(
                [(r, info.get("data_key")) for r, info in self.replica.items()],
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
        rows = self.steps.filter(pl.col("data_fp").is_not_null() & pl.col("rank").is_in(groups[0]))
        dup = rows.group_by("step", "data_fp").agg(pl.len().alias("n")).filter(pl.col("n") > 1)
        return int_of(dup["step"].min()) if dup.height else None

    @cached_property
    def epoch_steps(self) -> int | None:
        """Steps per epoch from the loader snapshot (dataset length / global batch)."""
        for snap in self.snapshots.values():
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
            not self.has_records
            or "ids" not in self.steps.columns
            or self.steps["ids"].null_count() == self.steps.height
        ):
            return None
        window = self.epoch_steps
        if not window:
            return None
        ids = self.steps.filter(pl.col("ids").is_not_null()).select("rank", "step", "ids")
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

    @cached_property
    def step_counts(self) -> dict[int, int]:
        if self.has_records:
            agg = self.steps.group_by("rank").agg(pl.col("step").max())
            return {int(r): int(s) for r, s in agg.iter_rows()}
        if self.losses.height:
            agg = self.losses.group_by("rank").agg(pl.col("step").max())
            return {int(r): int(s) for r, s in agg.iter_rows() if r is not None}
        return {}

    # ------------------------------------------------------------------ snapshots
    def initial_weights(self) -> tuple[list[int], int, int] | None:
        """Whether the replicas started from the same weights, from fingerprints taken
        before any update: (the odd ranks, distinct initial weights, ranks compared), or
        None when the snapshots cannot tell. Under a mesh, per replica group."""
        before = self.snapshot_values("init_param_fp_before_update")
        usable = {r: s for r, s in self.snapshots.items() if before.get(r) is not False}
        if len(usable) < 2:
            return None
        if self.replica:
            odd: set[int] = set()
            distinct = 0
            groups: dict[tuple[int, int], dict[int, int]] = {}
            for r in usable:
                info = self.replica.get(r) or {}
                for c, (key, fp) in enumerate(zip(info.get("keys") or [], info.get("init_fps") or [], strict=False)):
                    groups.setdefault((c, key), {})[r] = fp
            for values in groups.values():
                if len(values) > 1 and len(set(values.values())) > 1:
                    odd.update(majority_outliers(values))
                    distinct = max(distinct, len(set(values.values())))
            return sorted(odd), max(distinct, 1), len(usable)
        init_fps = {r: s.get("init_param_fp") for r, s in usable.items() if s.get("init_param_fp") is not None}
        if len(init_fps) < 2:
            return None
        return majority_outliers(init_fps), len(set(init_fps.values())), len(init_fps)

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

    # ------------------------------------------------------------------ events
    @cached_property
    def events(self) -> list[Event]:
        events: list[Event] = list(self.logs.events) if self.logs is not None else []
        if self.records is not None:
            for e in self.records.events:
                events.append(
                    Event(
                        kind=str(e.get("event", "info")),
                        raw=str(e.get("message", "")),
                        source=f"records/rank{e.get('rank')}.jsonl",
                        rank=e.get("rank"),
                        t=e.get("t"),
                        step=e.get("step"),
                    )
                )
        return events

    @cached_property
    def real_events(self) -> list[Event]:
        return [e for e in self.events if not e.benign and e.kind != "info"]

    def events_of(self, *kinds: str) -> list[Event]:
        return [e for e in self.real_events if e.kind in kinds]

    @cached_property
    def rebuilt_after(self) -> list[int]:
        """Steps after which the job rebuilt its model in the same process (a new wrapper
        or optimizer over the same parameters: the probe's `rebound` event), in order;
        each starts a new segment of the record."""
        events = self.records.events if self.records is not None else []
        return sorted(
            {
                int(e["step"])
                for e in events
                if e.get("event") == contract.REBOUND_EVENT and isinstance(e.get("step"), int)
            }
        )

    def rebuilt_within(self, after: int | None, upto: int) -> int | None:
        """The last rebuild in (after, upto): a parting bracketed there may be the rebuild's."""
        inside = [s for s in self.rebuilt_after if (after is None or s >= after) and s < upto]
        return inside[-1] if inside else None

    @cached_property
    def first_failure(self) -> Event | None:
        """The earliest crash or out-of-memory: the rank that started it, not the
        ranks that then lost their peer."""
        failures = self.events_of(*FAILURE_KINDS)
        if not failures:
            return None
        timed = [e for e in failures if e.t is not None]
        return min(timed, key=lambda e: cast(float, e.t)) if timed else failures[0]  # timed: t is set

    @cached_property
    def probe_disabled(self) -> dict[int, tuple[int | None, str]]:
        """Ranks whose probe disabled itself (an exception inside the probe): from that
        step on nothing was recorded or checked there. {rank: (step, message)}"""
        out: dict[int, tuple[int | None, str]] = {}
        for e in self.records.events if self.records is not None else []:
            message = str(e.get("message", ""))
            if message.startswith("probe disabled") and isinstance(e.get("rank"), int):
                out.setdefault(e["rank"], (e.get("step"), message))
        return out

    @cached_property
    def ended_early(self) -> list[int]:
        """Ranks whose records stop without an end record (killed, crashed)."""
        if self.records is None:
            return []
        return sorted(r for r in self.records.ranks if r not in self.records.ends)

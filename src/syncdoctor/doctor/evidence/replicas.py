"""Whether the replicas stayed identical: the first step at which they parted (from
the live checks and the step records), the first differing tensor, the update
counters there, and whether they started from the same weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import polars as pl

from syncdoctor.doctor.evidence.agreement import Agreement
from syncdoctor.doctor.evidence.fingerprints import Fingerprints
from syncdoctor.doctor.evidence.placement import Placement
from syncdoctor.doctor.evidence.sources import Facet, Sources, first_check_apart, int_of
from syncdoctor.records.compare import agreement as value_agreement
from syncdoctor.records.compare import majority_outliers

# Fingerprints that healthy data parallelism keeps bitwise equal across ranks.
INVARIANTS = ("param_fp", "opt_fp", "grad_fp")
COUNTERS = ("micro", "backward", "opt_steps")
# What must be configured alike (loss, optimizer, DDP settings), fingerprinted each step.
CONFIG = ("config_fp",)


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


# A flipped value changes the one tensor that holds it: the all-reduce keeps every other
# tensor equal across replicas. A change that reaches more than this share of the
# tensors (and more than two) comes from code that treats a rank apart.
CONFINED_SHARE = 0.25


@dataclass(frozen=True)
class Rebound:
    """The first check at which the ranks' live bindings differed (probe field
    params_rebound: the module's parameters that are not the watched objects, plus
    the watched ones whose storage was replaced): which ranks, how many each."""

    step: int
    since: int | None  # the check before, where the counts agreed (None: the first check)
    ranks: list[int]  # the ranks rebound apart from the rest
    counts: dict[int, int]  # rank -> params_rebound at `step` (0 where absent)
    first: str | None  # the first tensor the named ranks saw rebound


def confined(reach: tuple[int, int]) -> bool:
    """(tensors that differ, tensors compared): few enough for one flipped value."""
    parted, compared = reach
    return parted <= max(2, CONFINED_SHARE * compared)


class Replicas(Facet):
    """``ev.replicas``: whether, where and how the replicas parted."""

    def __init__(self, ev: Sources, placement: Placement, fingerprints: Fingerprints, agreement: Agreement) -> None:
        super().__init__(ev)
        self.placement = placement
        self.fingerprints = fingerprints
        self.agreement = agreement

    @cached_property
    def divergence(self) -> Divergence | None:
        """First step where fingerprints or counters part, from the live checks and
        from the step records (whichever saw it first)."""
        candidates = []
        bad = [
            c for c in self.ev.checks if c.get("status") == "mismatch" and not (c.get("detail") or {}).get("follow_up")
        ]
        if bad:
            first = min(bad, key=lambda c: c["step"])
            tensor = next(
                (
                    c.get("tensor")
                    for c in sorted(self.ev.checks, key=lambda c: c["step"])
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
        agreed = [s for s, parted in self.agreement.per_check if not parted and s < best.step]
        best.last_agree_step = max(agreed) if agreed else None
        return best

    def _parted_when_next_measured(self, step: int) -> set[str]:
        """Reduced gradients and optimizer state are fingerprinted less often than the
        parameters: whether they too had parted is read at the first step, from the
        divergence on, where they were measured. Not measured is not "equal"."""
        if not self.ev.has_records:
            return set()
        parted = set()
        for kind in ("grad", "opt"):
            first_measured = self.fingerprints.first_measured(kind, step)
            if first_measured is not None and self.fingerprints.first_disagreement(
                kind, first_measured, first_measured
            ):
                parted.add(kind)
        return parted

    def _divergence_from_steps(self) -> Divergence | None:
        steps = self.ev.steps
        if not self.ev.has_records or steps["rank"].n_unique() < 2:
            return None
        found: list[tuple[int, str, list[int], list[dict[str, Any]]]] = []
        for kind in ("param", "opt", "grad"):
            parted = self.fingerprints.first_disagreement(kind)
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
        for group in (g for f in first for g in f[3]) if self.placement.replica else ():
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
        steps = self.ev.steps
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
        if not self.ev.has_records or self.placement.replica:  # sharded tensors differ across ranks by design
            return None
        names = next((t for t in self.ev.snapshot_values("tensors").values() if isinstance(t, list)), None)
        at = self.ev.steps.filter(pl.col("step") == step)
        for column in ("tensor_fps", "tensor_norms"):
            rows = [v for v in at[column].to_list() if isinstance(v, list)] if column in at.columns else []
            if len(rows) < 2:
                continue
            for index, values in enumerate(zip(*rows, strict=False)):
                if len(set(values)) > 1:
                    return str(names[index]) if names and index < len(names) else f"parameter #{index}"
        return None

    def tensors_parted(self, step: int) -> tuple[int, int] | None:
        """(tensors that differ, tensors compared) at the first live mismatch at or after
        `step` that counted them (probe/torch/check.py), else None."""
        for check in sorted((c for c in self.ev.checks if c.get("status") == "mismatch"), key=lambda c: c["step"]):
            reach = (check.get("detail") or {}).get("tensors_differ")
            if (
                check["step"] >= step
                and isinstance(reach, list)
                and len(reach) == 2
                and all(isinstance(n, int) for n in reach)
            ):
                return reach[0], reach[1]
        return None

    def agree_after(self, kind: str, step: int) -> bool | None:
        """Whether `kind` (grad, opt) agreed within every replica group where it was
        first measured at or after `step`; None when it was not measured since."""
        first = self.fingerprints.first_measured(kind, step)
        if first is None:
            return None
        return self.fingerprints.first_disagreement(kind, first, first) is None

    @cached_property
    def rebound(self) -> Rebound | None:
        """Where the ranks' parameters first stopped being bound alike (probe fields
        params_rebound*, absent where zero): the first check whose counts differ."""
        steps = self.ev.steps if self.ev.has_records else None
        if steps is None or "params_rebound" not in steps.columns or "param_writes" not in steps.columns:
            return None
        rows = steps.filter(pl.col("param_writes").is_not_null()).with_columns(
            pl.col("params_rebound").fill_null(0).alias("rebound")
        )
        apart = first_check_apart(rows, "rebound", len(self.ev.ranks))
        if apart is None:
            return None
        step, since = apart
        at = rows.filter(pl.col("step") == step)
        counts = {int(r): int(c) for r, c in zip(at["rank"], at["rebound"], strict=True)}
        split = value_agreement(counts)
        # No strict majority (two ranks, an even split): the rebound ones are the ranks with the most.
        odd = split.odd if split.has_majority else [r for r, c in counts.items() if c == max(counts.values())]
        names = at["params_rebound_first"] if "params_rebound_first" in at.columns else [None] * at.height
        first = next((str(n) for r, n in zip(at["rank"], names, strict=True) if n is not None and int(r) in odd), None)
        return Rebound(step, since, sorted(odd), counts, first)

    @cached_property
    def counter_table(self) -> dict[str, dict[int, Any]]:
        """Counters per rank at the divergence step (or the last common step)."""
        if not self.ev.has_records:
            return {}
        div = self.divergence
        step = div.step if div else int_of(self.ev.steps["step"].max())
        at = self.ev.steps.filter(pl.col("step") == step)
        return {c: dict(zip(at["rank"].to_list(), at[c].to_list(), strict=True)) for c in COUNTERS if c in at.columns}

    @cached_property
    def micro_by_rank(self) -> dict[int, int]:
        """Typical micro-steps per update on each rank (the mode)."""
        if not self.ev.has_records:
            return {}
        modes = self.ev.steps.group_by("rank").agg(pl.col("micro").mode().first().alias("m"))
        return {int(r): int(m) for r, m in modes.iter_rows() if m is not None}

    @cached_property
    def incomplete_checks(self) -> list[dict[str, Any]]:
        return [c for c in self.ev.checks if c.get("status") == "incomplete"]

    def initial_weights(self) -> tuple[list[int], int, int] | None:
        """Whether the replicas started from the same weights, from fingerprints taken
        before any update: (the odd ranks, distinct initial weights, ranks compared), or
        None when the snapshots cannot tell. Under a mesh, per replica group."""
        before = self.ev.snapshot_values("init_param_fp_before_update")
        usable = {r: s for r, s in self.ev.snapshots.items() if before.get(r) is not False}
        if len(usable) < 2:
            return None
        if self.placement.replica:
            odd: set[int] = set()
            distinct = 0
            groups: dict[tuple[int, int], dict[int, int]] = {}
            for r in usable:
                info = self.placement.replica.get(r) or {}
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

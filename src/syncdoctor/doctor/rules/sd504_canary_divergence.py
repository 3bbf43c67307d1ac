from __future__ import annotations

from typing import Any

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement

MIN_ACT_STEPS = 8  # steps with activation statistics on at least three ranks: the data verdict's floor
EXTREME_SHARE = 0.9  # one rank the highest (or lowest) at this share of them: not batch-to-batch chance


class CanaryDivergence(Rule):
    """The same fixed batch gives a different layer output on some rank (the canary forward).

    **Symptom:** ranks drift apart, or one rank's loss sits apart from the others',
    with no error; at a detailed check the probe's canary (one batch built alike on
    every rank) came out of some layer differently on some rank, or it agreed
    everywhere while the real batches' activations did not.

    **Cause:** identical input and a different output at a layer means that layer's
    state differs: its parameters (unseeded init, no broadcast), its buffers
    (BatchNorm statistics) or its mode (train vs eval). When the very first layer
    already parts, the model was never the same; a deeper first layer points at that
    layer's own state. A canary that agrees while the ranks' real activations
    differ persistently means the model is the same and the data is not.

    **Quick check:** feed one fixed tensor (`torch.manual_seed(0); x = torch.randn(...)`)
    through the model under `torch.no_grad()` on every rank with forward hooks, and
    compare each layer's output hash; print `model.training` of each module.

    **Fix:** make the named layer's state equal on every rank: seed the model and
    broadcast the parameters (DDP does at construction), call `model.train()` on
    every rank after evaluation, keep `broadcast_buffers=True` or SyncBatchNorm; for
    the data verdict, check each rank's sampler, shard and preprocessing.
    """

    code = "SD504"
    name = "canary-divergence"
    category = "model.canary_divergence"
    stage = "forward"
    severity = "warning"  # it locates; the specific cause (SD501, SD502, SD503) explains
    title = "A fixed canary batch parts across ranks at a named layer"

    def evaluate(self, ev: Evidence) -> Finding | None:
        if not ev.has_records or "canary" not in ev.steps.columns:
            return None
        rows = ev.steps.filter(pl.col("canary").is_not_null()).select("rank", "step", "canary", *_mode(ev))
        if not rows.height:
            return None
        checks: dict[int, dict[int, dict[str, Any]]] = {}
        for row in rows.sort("step", "rank").iter_rows(named=True):
            checks.setdefault(int(row["step"]), {})[int(row["rank"])] = row
        for step, by_rank in checks.items():
            parted = _first_parting(by_rank)
            if parted is not None:
                return self._model_verdict(step, by_rank, *parted)
        if all(len(by_rank) > 1 and _agree(by_rank) for by_rank in checks.values()):
            return self._data_verdict(ev, sorted(checks))
        return None

    def _model_verdict(
        self, step: int, by_rank: dict[int, dict[str, Any]], index: int, layer: str, odd: list[int]
    ) -> Finding:
        modes = {r: row.get("train_mode") for r, row in by_rank.items() if row.get("train_mode") is not None}
        mode_split = len(set(modes.values())) > 1
        if mode_split:
            verdict = "train/eval modes differ (same input, different output)"
            trained = {r: _modules_in_train(m) for r, m in modes.items()}
            odd = (
                sorted(r for r, n in trained.items() if n < max(trained.values())) or odd
            )  # training runs in train mode
        elif index == 0:
            verdict = "parameters or modes differ (same input, different output at the first layer)"
        else:
            verdict = f"the state of {layer} (parameters, buffers or mode) differs; the layers before it agree"
        first = by_rank[min(by_rank)]["canary"]
        evidence = [
            f"step {step}: the canary batch ({first['sig']}) parts first at layer {layer!r} "
            f"(#{index + 1} of {len(first['layers'])} in execution order): {verdict}",
            "canary output mean/std at that layer: "
            + ", ".join(
                f"rank {r} {_fmt(row['canary']['mean'], index)}/{_fmt(row['canary']['std'], index)}"
                for r, row in sorted(by_rank.items())[:8]
            ),
        ]
        if mode_split:
            evidence.append("modules in train mode: " + ", ".join(f"rank {r} {m}" for r, m in sorted(modes.items())))
        return self.found(0.6, evidence, ranks=odd, step=step, tensor=layer)

    def _data_verdict(self, ev: Evidence, steps: list[int]) -> Finding | None:
        """The canary agreed at every check: a rank whose real-batch activations sit at
        one extreme almost always is fed different data."""
        if "acts" not in ev.steps.columns:
            return None
        acts = ev.steps.filter(pl.col("acts").list.len() > 0).select("rank", "step", pl.col("acts").list.first())
        acts = acts.with_columns(pl.col("acts").struct.field("mean").alias("mean")).drop_nulls("mean")
        per_step = acts.group_by("step").agg(pl.col("rank"), pl.col("mean")).filter(pl.col("rank").list.len() >= 3)
        if per_step.height < MIN_ACT_STEPS:
            return None
        top: dict[int, int] = {}
        bottom: dict[int, int] = {}
        for ranks, means in zip(per_step["rank"].to_list(), per_step["mean"].to_list(), strict=True):
            order = sorted(zip(means, ranks, strict=True))
            bottom[order[0][1]] = bottom.get(order[0][1], 0) + 1
            top[order[-1][1]] = top.get(order[-1][1], 0) + 1
        for side, counts in (("highest", top), ("lowest", bottom)):
            rank, n = max(counts.items(), key=lambda kv: kv[1])
            if n >= EXTREME_SHARE * per_step.height:
                return self.found(
                    0.5,
                    [
                        f"the canary batch gave bitwise the same output on every rank at every check "
                        f"(steps {steps[0]}-{steps[-1]}): parameters, buffers and modes agree",
                        f"rank {rank}'s real-batch activations (first block) are the {side} of all ranks "
                        f"at {n} of {per_step.height} steps: the difference is in the data",
                    ],
                    ranks=[rank],
                    step=steps[0],
                    title="Ranks' models agree on a fixed batch; their data differs",
                )
        return None


def _mode(ev: Evidence) -> list[str]:
    return ["train_mode"] if "train_mode" in ev.steps.columns else []


def _comparable(by_rank: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The ranks whose canary has the most common signature and layer list (ranks
    that saw other input shapes built another canary: not comparable)."""
    keys = {r: (row["canary"]["sig"], tuple(row["canary"]["layers"] or ())) for r, row in by_rank.items()}
    split = agreement(keys)
    key = split.reference if split.has_majority else keys[min(keys)]
    return {r: row["canary"] for r, row in by_rank.items() if keys[r] == key}


def _agree(by_rank: dict[int, dict[str, Any]]) -> bool:
    same = _comparable(by_rank)
    return len(same) == len(by_rank) and len({tuple(c["fps"] or ()) for c in same.values()}) == 1


def _first_parting(by_rank: dict[int, dict[str, Any]]) -> tuple[int, str, list[int]] | None:
    """(layer index, layer name, odd ranks) of the first layer whose output differs."""
    same = _comparable(by_rank)
    if len(same) < 2:
        return None
    fps = {r: list(c["fps"] or ()) for r, c in same.items()}
    layers = list(next(iter(same.values()))["layers"] or ())
    for index, layer in enumerate(layers):
        split = agreement({r: f[index] if index < len(f) else None for r, f in fps.items()})
        if not split.agree:
            return index, layer, split.odd
    return None


def _modules_in_train(mode: Any) -> int:
    """The n of an `n/m` or `n/m:bitmap` train_mode value."""
    try:
        return int(str(mode).split("/")[0])
    except ValueError:
        return 0


def _fmt(values: list[float | None] | None, index: int) -> str:
    value = values[index] if values and index < len(values) else None
    return "n/a" if value is None else f"{value:.4g}"

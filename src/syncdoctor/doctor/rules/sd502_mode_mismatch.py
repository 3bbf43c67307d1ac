from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split


class ModeMismatch(Rule):
    """Ranks run the model in different train/eval modes.

    **Symptom:** one rank's loss is persistently lower or higher than the others';
    BatchNorm statistics and dropout behave differently per rank.

    **Cause:** `model.train()` / `net.set_train()` missing or called on some ranks
    only (often after an evaluation that ran on rank 0 alone).

    **Quick check:** log `model.training` (and BN/dropout modules' modes) on every rank each epoch.

    **Fix:** call `model.train()` / `net.set_train(True)` on every rank before training
    and after every evaluation.
    """

    code = "SD502"
    name = "mode-mismatch"
    category = "model.mode_mismatch"
    stage = "forward"
    title = "Train/eval mode differs across ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if not ev.has_records or "train_mode" not in ev.steps.columns:
            return None
        modes = ev.steps.filter(pl.col("train_mode").is_not_null())
        per_step = modes.group_by("step").agg(pl.col("train_mode").n_unique().alias("k")).filter(pl.col("k") > 1)
        if not per_step.height and not (div and "mode" in div.what):
            return None
        step = int_of(per_step["step"].min()) if per_step.height else div.step  # type: ignore[union-attr]  # div is set: see above
        at = modes.filter(pl.col("step") == step)
        values = dict(zip(at["rank"].to_list(), at["train_mode"].to_list(), strict=True))
        split = agreement(values)
        odd = split.odd
        if not split.has_majority:
            # No majority, but the mode itself tells: training runs in train mode, so
            # the ranks with fewer modules in train mode are the odd ones.
            trained = {r: _modules_in_train(v) for r, v in values.items()}
            most = max(trained.values())
            odd = sorted(r for r, n in trained.items() if n < most) or odd
        return self.found(
            0.95,
            [
                f"modules in train mode at step {step}: " + describe_split(values),
            ],
            ranks=odd,
            step=step,
        )


def _modules_in_train(mode: str) -> int:
    """The n of an `n/m` or `n/m:bitmap` train_mode value."""
    try:
        return int(str(mode).split("/")[0])
    except ValueError:
        return 0

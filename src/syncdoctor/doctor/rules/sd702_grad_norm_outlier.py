from __future__ import annotations

import math

import numpy as np
import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

RATIO = 10.0  # local gradient norms of healthy ranks stay within a small factor of each other


class GradNormOutlier(Rule):
    """One rank's own gradients are orders of magnitude larger or smaller than the others'.

    **Symptom:** per-rank gradient norms differ by orders of magnitude; that rank
    dominates the average and drags the update its way.

    **Cause:** that rank's data is abnormal (a corrupt shard, different
    preprocessing or augmentation) or its loss is computed differently.

    **Quick check:** print each rank's local gradient norm per layer before the
    all-reduce, and the first batch's statistics on that rank.

    **Fix:** check that rank's data pipeline (augmentation, normalisation, shard
    contents), its loss settings and its code version against the others'.
    """

    code = "SD702"
    name = "grad-norm-outlier"
    category = "loss.definition_mismatch"
    stage = "backward"
    title = "One rank's gradient norm is orders of magnitude off"

    def evaluate(self, ev: Evidence) -> Finding | None:
        if not ev.has_records or "grad_norm_local" not in ev.steps.columns:
            return None
        per_rank = (
            ev.steps.filter(pl.col("grad_norm_local").is_not_null() & (pl.col("grad_norm_local") > 0))
            .group_by("rank")
            .agg(pl.col("grad_norm_local").median().alias("n"))
        )
        if per_rank.height < 2:
            return None
        norms = dict(zip(per_rank["rank"].to_list(), per_rank["n"].to_list(), strict=True))
        if max(norms.values()) < RATIO * min(norms.values()):
            return None
        # Distance from the geometric median; with two ranks both are equally far.
        center = float(np.median(np.log(list(norms.values()))))
        odd = sorted(r for r, n in norms.items() if abs(math.log(n) - center) >= math.log(RATIO) / 2)
        if len(norms) > 2 and len(odd) * 2 >= len(norms):
            return None
        typical = math.exp(center)
        return self.found(
            0.7,
            [f"median local gradient norm {norms[r]:.3g} on rank {r} vs {typical:.3g} typical" for r in odd[:4]],
            ranks=odd,
            title=f"Gradient norm of {fmt_ranks(odd)} is orders of magnitude off",
        )

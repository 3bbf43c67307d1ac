from __future__ import annotations

import numpy as np
import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding, LossShape
from syncdoctor.doctor.rules._thresholds import BLOW_UP
from syncdoctor.doctor.rules.base import Rule

STILL_LEARNING = 0.05  # the last quarter's second half 5 % below its first half: still learning


class TrainDivergence(Rule):
    """The loss diverges on every rank in lockstep: not a synchronisation problem.

    **Symptom:** the loss rises steadily, blows up and never recovers, or turns
    NaN/inf — the same way on all ranks.

    **Cause:** something global — learning rate, model, data labels — not the
    collaboration between cards; single-card training would show it too.

    **Quick check:** run the same recipe on one card with a fixed seed; it should diverge too.

    **Fix:** treat it as a training problem, not a synchronisation one: lower the
    learning rate or add warm-up and gradient clipping, check the labels and the model,
    and reproduce on one card.
    """

    code = "SD101"
    name = "train-divergence"
    category = "train.divergence"
    stage = "training"
    title = "Loss diverges on every rank in lockstep: not a sync problem"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        shape = ev.loss.mean_shape
        if shape is None or ev.replicas.divergence is not None:
            return None  # no curve, or replicas parted: the sync rules explain it
        why_bad = self._bad_curve(ev, shape)
        if why_bad is None:
            return None
        healthy = [s.rank for s in ev.loss.rank_shapes if s.shape == "decreasing"]
        if healthy and len(ev.loss.rank_shapes) > 1:
            return None  # some ranks learn normally: not a global training problem
        rank_shapes = {s.shape for s in ev.loss.rank_shapes}
        if ev.has_records:
            confidence = 0.9
            why = "replicas stayed bitwise identical (parameters, optimizer state) while the loss went wrong"
        elif len(ev.loss.rank_shapes) > 1 and len(rank_shapes) <= 2:
            confidence = 0.7
            why = f"all {len(ev.loss.rank_shapes)} ranks' curves go wrong the same way"
        elif len(ev.loss.rank_shapes) == 1:
            confidence = 0.5
            why = "only one rank's loss is known"
        else:
            return None
        return self.found(confidence, [why_bad, why])

    @staticmethod
    def _bad_curve(ev: Evidence, shape: LossShape) -> str | None:
        if shape.shape in ("diverging", "nonfinite"):
            return f"loss shape: {shape.shape} — {shape.detail}"
        mean = ev.losses.group_by("step").agg(pl.col("loss").mean()).sort("step")["loss"].to_numpy()
        mean = mean[np.isfinite(mean)]
        if len(mean) < 10:
            return None
        start, peak = float(np.min(mean[:3])), float(np.max(mean))
        last = mean[-max(6, len(mean) // 4) :]
        tail = float(np.median(last))
        if not (start > 0 and peak > BLOW_UP * start and tail > 0.5 * start):
            return None
        # Blown up far above where it started and not learning since: the last
        # quarter is no lower at its end than at its start. A run that came back and
        # still goes down did recover, whatever its peak.
        half = len(last) // 2
        if float(np.median(last[half:])) < (1 - STILL_LEARNING) * float(np.median(last[:half])):
            return None
        if tail >= start:
            return (
                f"the loss blew up from {start:.3g} to {peak:.3g} and never came back below its start "
                f"(last quarter {tail:.3g}): the step size is too large for the model"
            )
        return (
            f"the loss blew up from {start:.3g} to {peak:.3g}, came down to {tail:.3g} and stopped "
            "learning there (flat last quarter): the step size is too large for the model"
        )

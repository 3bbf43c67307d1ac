from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class TrainDivergence(Rule):
    """The loss diverges on every rank in lockstep: not a synchronisation problem.

    **Symptom:** the loss rises steadily or turns NaN/inf, the same way on all ranks
    (playbook §1.1, the second "bad shape").

    **Cause:** something global — learning rate, model, data labels — not the
    collaboration between cards; single-card training would show it too.

    **Quick check:** run the same recipe on one card with a fixed seed; it should diverge too.

    **Fix:** lower the learning rate or add warm-up/clipping; check labels and model.
    """

    code = "SD101"
    name = "train-divergence"
    category = "train.divergence"
    title = "Loss diverges on every rank in lockstep: not a sync problem"
    fix = "Treat it as a training problem: lower the learning rate (or add warm-up and gradient clipping), check labels and the model; reproduce on one card."
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        shape = ev.mean_shape
        if shape is None or shape.shape not in ("diverging", "nonfinite"):
            return None
        if ev.divergence is not None:
            return None  # replicas parted: the sync rules explain it
        rank_shapes = {s.shape for s in ev.rank_shapes}
        if ev.has_records:
            confidence = 0.9
            why = "replicas stayed bitwise identical (parameters, optimizer state) while the loss diverged"
        elif len(ev.rank_shapes) > 1 and rank_shapes <= {"diverging", "nonfinite", "sawtooth", "spike"}:
            confidence = 0.7
            why = f"all {len(ev.rank_shapes)} ranks show the same shape"
        elif len(ev.rank_shapes) == 1:
            confidence = 0.5
            why = "only one rank's loss is known"
        else:
            return None
        return self.found(confidence, [f"loss shape: {shape.shape} — {shape.detail}", why])

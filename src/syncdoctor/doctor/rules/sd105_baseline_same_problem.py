from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class BaselineSameProblem(Rule):
    """A baseline run (one card, or an earlier healthy recipe) shows the same trouble.

    **Symptom:** the loss blows up, turns NaN, sticks at chance level or jumps in
    stages on many cards; `syncdoctor diagnose RUN --baseline BASELINE` was given a
    baseline run, and its loss curve goes wrong the same way.

    **Cause:** whatever breaks the baseline is not the collaboration between cards:
    the learning rate, the model, the data or the loss. The parallel part is cleared
    for this symptom (unless the run's replicas were also seen to part: then both
    problems are real, and this finding ranks below the sync cause).

    **Quick check:** compare the two curves in the report's baseline chart: they
    go wrong at about the same point (by samples seen when the global batches differ).

    **Fix:** debug it on one card first: lower the learning rate or add warm-up and
    gradient clipping, check the labels, the loss and the model; then scale out.
    """

    code = "SD105"
    name = "baseline-same-problem"
    category = "train.divergence"
    stage = "training"
    title = "The baseline run shows the same problem: not the parallel part"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        cmp = ev.baseline
        if cmp is None or cmp.verdict != "not_parallel_part":
            return None
        evidence = [f"baseline {cmp.path}: {cmp.summary}", *cmp.evidence]
        if ev.replicas.divergence is not None:
            # The replicas did part: a sync cause is real too and ranks first.
            evidence.insert(
                1, f"but this run's replicas parted at step {ev.replicas.divergence.step}: a sync cause as well"
            )
            return self.found(0.5, evidence, severity="warning", step=cmp.parted_at_step)
        # The comparison observed the cause's absence directly: the same recipe
        # without the parallel part fails the same way.
        return self.found(0.95, evidence, step=cmp.parted_at_step, direct=True)

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class FinalEvaluationApart(Rule):
    """The ranks' final evaluations differ while their losses never drifted apart.

    **Symptom:** every rank prints its evaluation at the end (`val_acc 0.889` on one,
    `0.909` on another) and the numbers differ; during training the ranks' losses
    scatter around each other as on healthy shards, with no trend.

    **Cause:** the replicas were never equal: each rank initialised its own model (no
    seed, or a seed offset by rank, and no broadcast of the initial weights, as in
    hand-written data parallelism or MindSpore's PyNative DATA_PARALLEL). The averaged
    gradient moves every replica by the same update, so they stay as far apart as
    they started.

    **Quick check:** print a checksum of the parameters on every rank right after the
    model is built and after the first step; run under `syncdoctor run`.

    **Fix:** seed every rank with the same seed before building the model, or
    broadcast rank 0's parameters and buffers before training (DDP does at
    construction; `mindspore.communication` and hand-written loops do not).
    """

    code = "SD506"
    name = "final-evaluation-apart"
    category = "model.init_mismatch"
    stage = "init"
    title = "The ranks' final evaluations differ with no drift in training: the replicas started apart"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        parted, drift = ev.evaluations.parted, ev.evaluations.drift
        if not parted or (drift is not None and drift.drifting):
            return None
        if ev.settings.rank_only_keys or ev.settings.log_partings:
            # the logs show what parted the replicas (a rank-conditional branch, a value
            # that must be equal and is not): the evaluations are its consequence
            return None
        evidence = [ev.evaluations.describe()]
        if drift is not None:
            gaps = ", ".join(f"rank {r}: {drift.early[r]:+.1%} → {drift.late[r]:+.1%}" for r in sorted(drift.late))
            evidence.append(
                f"the ranks' loss gaps to the same-step mean show no drift (steps {drift.steps[0]}–{drift.steps[1]} "
                f"against {drift.steps[2]}–{drift.steps[3]}: {gaps}): the replicas received the same updates, "
                "so they differed from the start"
            )
        return self.found(0.6, evidence)

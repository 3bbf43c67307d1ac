from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class UpdateDrift(Rule):
    """The replicas drift apart during training: the ranks apply different updates.

    **Symptom:** the ranks' losses start together and part more with every epoch (one
    rank's loss stalls or rises while the others keep falling), and the evaluation
    every rank prints at the end differs; no error anywhere.

    **Cause:** the optimizer is not configured alike on every rank: a learning rate,
    weight decay or momentum read from a per-node config file, a scheduler stepped on
    some ranks only, an optimizer built from rank-dependent settings. The gradients
    are averaged, but each rank turns them into its own update.

    **Quick check:** print the optimizer's param-group settings (lr, weight_decay,
    momentum, betas) on every rank at start and at the end.

    **Fix:** build the optimizer and scheduler from one config on every rank (broadcast
    the config from rank 0, or assert it is equal across ranks at start).
    """

    code = "SD602"
    name = "update-drift"
    category = "optim.state_mismatch"
    stage = "optimizer"
    title = "The replicas drift apart: the ranks apply different updates"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        parted, drift = ev.evaluations.parted, ev.evaluations.drift
        if not parted or drift is None or not drift.drifting:
            return None
        moved = drift.drifting
        gaps = ", ".join(f"rank {r}: {drift.early[r]:+.1%} → {drift.late[r]:+.1%}" for r in moved)
        evidence = [
            f"the ranks' losses start together and drift apart: gap to the same-step mean over steps "
            f"{drift.steps[0]}–{drift.steps[1]} against {drift.steps[2]}–{drift.steps[3]}: {gaps}; "
            "on equal replicas the gap is data noise with no trend",
            ev.evaluations.describe(),
            "the replicas started equal and each took updates of its own: an optimizer setting "
            "(lr, weight decay, momentum) differs across ranks",
        ]
        # Two ranks mirror each other around their mean: neither is known to be the odd one.
        ranks = moved if len(drift.late) > 2 and len(moved) < len(drift.late) / 2 else []
        return self.found(0.7, evidence, ranks=ranks, step=drift.steps[2])

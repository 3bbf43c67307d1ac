from __future__ import annotations

import math

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class LrNotScaled(Rule):
    """The global batch grew with the world size but the learning rate did not.

    **Symptom:** all ranks agree, nothing errors, the loss simply decreases slower
    than on fewer cards.

    **Cause:** data parallelism multiplies the global batch by the number of cards;
    a learning rate tuned for one card is then too small per sample.

    **Quick check:** compare lr / global batch with the single-card recipe.

    **Fix:** scale the learning rate with the global batch: lr = base_lr × global_batch
    / base_batch (the linear rule; the square root of that factor for Adam-like
    optimizers), usually with a warm-up. The rule needs the single-card recipe:
    `syncdoctor.attach(..., baseline={"lr": ..., "batch_size": ...})`.
    """

    code = "SD102"
    name = "lr-not-scaled"
    category = "hparam.lr_scaling"
    stage = "training"
    severity = "warning"
    title = "Learning rate not scaled to the global batch"

    def evaluate(self, ev: Evidence) -> Finding | None:
        for rank, snap in sorted(ev.snapshots.items()):
            base = snap.get("baseline") or {}
            groups = (snap.get("optimizer") or {}).get("param_groups") or [{}]
            lr, global_batch = groups[0].get("lr"), snap.get("global_batch")
            if not (base.get("lr") and base.get("batch_size") and lr and global_batch):
                continue
            growth = global_batch / base["batch_size"]
            lr_ratio = lr / base["lr"]
            if growth >= 2 and lr_ratio < 0.9 * math.sqrt(growth):
                return self.found(
                    0.75,
                    [
                        f"global batch {global_batch} is {growth:g}× the single-card batch {base['batch_size']}",
                        f"learning rate {lr:g} is {lr_ratio:.2g}× the single-card {base['lr']:g} (linear rule: {base['lr'] * growth:g})",
                    ],
                    ranks=[rank],
                )
            return None
        return None

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class SummedGradients(Rule):
    """Gradients are summed across ranks instead of averaged.

    **Symptom:** the effective learning rate is N× the intended one: the loss
    jumps or diverges as soon as more cards join.

    **Cause:** `gradients_mean=False` in MindSpore's auto-parallel context, an
    all-reduce with SUM and no division in a hand-written loop or comm hook.

    **Quick check:** compare the gradient norm after the reduction with the
    ranks' local norms: an average can never be larger than their mean.

    **Fix:** average the gradients: `set_auto_parallel_context(gradients_mean=True)`
    (MindSpore); divide by the world size after `all_reduce(SUM)` in custom loops and
    comm hooks, or keep DDP's default hook.
    """

    code = "SD403"
    name = "summed-gradients"
    category = "sync.reduce_op"
    title = "Gradients summed across ranks, not averaged"

    def evaluate(self, ev: Evidence) -> Finding | None:
        means = ev.snapshot_values("ddp", "gradients_mean")
        if any(v is False for v in means.values()):
            return self.found(0.95, ["parallel context: gradients_mean=False"], ranks=ev.ranks)
        excess = ev.reduce.excess
        if excess is None or excess["above_one"] < 0.3:
            return None
        return self.found(
            0.9,
            [
                f"post-reduce gradient norm exceeds the ranks' mean local norm at {excess['above_one']:.0%} of "
                f"{excess['steps']} measured steps (median ratio {excess['median']:.2f}); an average is never larger",
            ],
            ranks=ev.ranks,
        )

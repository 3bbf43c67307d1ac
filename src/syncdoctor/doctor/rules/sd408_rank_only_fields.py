from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class RankOnlyFields(Rule):
    """Some ranks print fields on the per-step line that the others never print.

    **Symptom:** every rank prints the same kind of line at the same steps (`step=…
    loss=…`), but on some ranks it carries fields the others never show (`grad_norm=…
    clip=1.0` on rank 0 only): no error, and the replicas may drift apart slowly.

    **Cause:** a rank-conditional branch inside the training step (`if rank == 0:`
    around gradient clipping, a scheduler step, a metric that changes state): the
    ranks do not run the same code at every step. Printing on one rank is harmless;
    a branch that changes gradients, parameters or the optimizer on one rank is not.

    **Quick check:** find the `if rank == 0` (or `is_main_process`) around the code
    that prints the extra fields; check whether it changes gradients, parameters or
    the optimizer.

    **Fix:** run every state-changing step (clipping, scheduler, optimizer, buffer
    updates) on every rank; keep only logging and saving under a rank condition.
    """

    code = "SD408"
    name = "rank-only-fields"
    category = "sync.control_flow"
    stage = "sync_schedule"
    severity = "warning"
    title = "Ranks print different fields on the same step line: a rank-conditional branch"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        keys = ev.settings.rank_only_keys
        if not keys or ev.has_records:
            return None
        first = keys[0]
        names = ", ".join(f"`{k.key}`" for k in keys[:6])
        verb = "prints" if len(first.printing) == 1 else "print"
        never = "never prints" if len(first.silent) == 1 else "never print"
        evidence = [
            f"{fmt_ranks(first.printing)} {verb} {names} on the `{first.anchor}` line at every one of "
            f"{first.steps} shared steps; {fmt_ranks(first.silent)} {never} {'it' if len(keys) == 1 else 'them'}",
            "the ranks run different code at each step: if that branch changes gradients, parameters or "
            "the optimizer, the replicas part",
        ]
        return self.found(0.55, evidence, ranks=first.printing, step=first.first_step)

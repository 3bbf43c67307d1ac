from __future__ import annotations

from syncdoctor.doctor.evidence import Divergence, Evidence, int_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class IncompleteReduce(Rule):
    """The gradient average left a rank out: reduced gradients differ across ranks.

    **Symptom:** no error, the loss drifts or jumps on some ranks after a
    communication timeout/retry; replicas part silently.

    **Cause:** the all-reduce ran over an incomplete group (a rank marked
    unavailable after a retry, a wrong group or world size), so the ranks apply
    different "averages" and the left-out rank trains alone.

    **Quick check:** fingerprint the gradients right after the all-reduce on every rank;
    they must be bitwise equal.

    **Fix:** make communication errors fatal instead of training on past them (NCCL/HCCL
    async error handling such as TORCH_NCCL_ASYNC_ERROR_HANDLING=1, a finite
    HCCL_EXEC_TIMEOUT), restart from the last checkpoint, and fix the failing link
    (network, driver/firmware).
    """

    code = "SD401"
    name = "incomplete-reduce"
    category = "sync.incomplete_reduce"
    stage = "reduced"
    title = "Gradient all-reduce incomplete: ranks apply different gradients"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if div is None or "counter" in div.what or "mode" in div.what:
            return None
        if ev.numerics.overflow_disagreement:
            return None  # a rank zeroed its overflowed gradients: the overflow rule owns it
        changed = ev.reduce.changed_after_reduce
        if changed is not None and changed.step <= div.step:
            return None  # the all-reduce was seen deliver one gradient: what followed it changed them (SD412)
        if "grad" not in div.what:
            return self._unmeasured(ev, div)
        evidence = [
            f"reduced gradients differ across ranks from step {div.step} on {fmt_ranks(div.ranks)} "
            "while step counters agree"
        ]
        if div.tensor:
            evidence.append(f"first differing tensor: {div.tensor}")
        if ev.reduce.unreduced_ranks:
            evidence.append(
                f"{fmt_ranks(ev.reduce.unreduced_ranks)}: post-reduce gradient norm equals the local one "
                "(ratio 1.0): its gradients were not averaged with anyone"
            )
        comm = [
            e for e in ev.events.of("retry", "timeout", "watchdog", "network") if e.step is None or e.step <= div.step
        ]
        for event in comm[:3]:
            evidence.append(f"before the divergence: {event.source}:{event.line}: {event.raw[:160]}")
        # The rank whose gradients came out of the reduce untouched is the one left out:
        # evidence that names it even where no majority could (two ranks).
        ranks = [r for r in ev.reduce.unreduced_ranks if r in div.ranks]
        if not ranks or len(ranks) == len(div.ranks):
            # Every rank averaged alone (two ranks): the one whose link failed before the
            # divergence is the one left out.
            struck = sorted({e.rank for e in comm if e.rank is not None and e.rank in div.ranks})
            ranks = struck if struck and len(struck) < len(div.ranks) else div.ranks
        return self.found(0.9, evidence, ranks=ranks, step=div.step, tensor=div.tensor)

    def _unmeasured(self, ev: Evidence, div: Divergence) -> Finding | None:
        """Parameters part later in the run with counters, modes and configuration in
        agreement, and the reduced gradients not fingerprinted since: a gradient that
        skipped its reduction is the likeliest cause, though not shown."""
        first_step = int_of(ev.steps["step"].min()) if ev.has_records else None
        if (
            "param" not in div.what
            or "config" in div.what
            or ev.settings.hyperparameter_drift is not None
            or div.step == first_step
            or ev.replicas.agree_after("grad", div.step) is not None
            or ev.differing("optimizer", "param_groups")
            or ev.differing("loss", "params")
        ):
            return None
        evidence = [
            f"parameters part at step {div.step} on {fmt_ranks(div.ranks)} while step counters, modes "
            "and the optimizer/loss configuration agree",
            "the reduced gradients were not fingerprinted after that step (detailed checks are rarer); "
            "a gradient that skipped its reduction is the likeliest cause; `--check-every 1` or a longer "
            "run shows it",
        ]
        if div.tensor:
            evidence.append(f"first differing tensor: {div.tensor}")
        return self.found(0.6, evidence, ranks=div.ranks, step=div.step, tensor=div.tensor)

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule

_FAILURES = ("crash", "oom", "timeout", "watchdog", "network", "mismatch", "configuration")


class LogOnlyInconclusive(Rule):
    """One rank's log cannot show that the replicas agree: what to run next.

    **Symptom:** a pasted log with no error and the loss of at most one rank (or
    none): nothing is wrong in it, and nothing in it shows that the ranks trained the
    same model.

    **Cause:** silent desynchronisation (an unseeded init, a rank left in eval mode,
    summed gradients) leaves no error line; only a comparison of the ranks shows it.

    **Quick check:** print every rank's loss and gradient norm for the same steps.

    **Fix:** record the job with `syncdoctor run -- <your launcher command>` (no code
    change) and run `syncdoctor diagnose` on the run folder: the probe compares the
    replicas bitwise.
    """

    code = "SD991"
    name = "log-only-inconclusive"
    category = "healthy"
    severity = "info"
    title = "Nothing wrong in this log, but one rank's log cannot show the replicas agree"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        if ev.has_records or len(ev.ranks) > 1 or ev.events_of(*_FAILURES):
            return None
        seen = f"the loss of rank {ev.ranks[0]} only" if ev.ranks else "no per-rank training loss"
        return self.found(
            0.5,
            [
                f"this log holds {seen} and no error: replicas cannot be compared from it",
                "next: syncdoctor run -- <launcher ...>, then syncdoctor diagnose <run folder>",
            ],
        )

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import first_process_failure, one_sided_work_before
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class OneSidedWorkBeforeTimeout(Rule):
    """A collective timed out while one rank was busy with work of its own.

    **Symptom:** the ranks' watchdog reports "Watchdog caught collective operation
    timeout", and the last thing the log shows before it is work that usually runs
    on one rank: saving a checkpoint, evaluation or validation, the end of
    ``fit()``, a long preprocessing or download progress bar. No process crashed
    first and no link error is reported.

    **Cause:** rank-dependent control flow around a collective: rank 0 (or a few
    ranks) saves, evaluates or preprocesses while the others already wait in the
    next all-reduce or barrier; past the timeout the watchdog kills the job. The
    network did nothing wrong.

    **Quick check:** compare which ranks report the timeout with the rank that
    printed the work line; time the work (it exceeds the process-group timeout).

    **Fix:** do that work on every rank or outside the collective path (save with the
    distributed checkpoint API, evaluate on all ranks with a sharded sampler), put a
    barrier after it, or raise the timeout only around it.
    """

    code = "SD407"
    name = "one-sided-work-before-timeout"
    category = "sync.control_flow"
    stage = "sync_schedule"
    title = "A collective timed out while one rank was busy with its own work"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        waits = [e for e in ev.events.of("watchdog", "timeout") if e.line is not None]
        if not waits or first_process_failure(ev.events.all) is not None:
            return None
        if ev.events.of("network", "configuration", "oom", "crash"):
            return None  # a link or set-up error, or a crash, explains the wait better
        first = min(waits, key=lambda e: (e.t is None, e.t or 0.0, e.source, e.line or 0))
        work = one_sided_work_before(first.source, first.line or 0)
        if work is None:
            return None
        waiting = sorted({e.rank for e in waits if e.rank is not None})
        who = fmt_ranks(waiting) if waiting else "the waiting ranks"
        return self.found(
            0.85,
            [
                f"just before {who} timed out in a collective, the log shows one-sided work: {work[:200]}",
                f"{first.source}:{first.line}: {first.raw[:160]}",
                "one rank busy with its own work while the others wait in a collective: control flow, not the network",
            ],
            ranks=waiting,
            step=first.step,
        )

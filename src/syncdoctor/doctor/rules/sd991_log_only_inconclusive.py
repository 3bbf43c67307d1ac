from __future__ import annotations

from collections import Counter

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
    stage = "params"
    severity = "info"
    title = "Nothing wrong in this log, but one rank's log cannot show the replicas agree"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        if ev.has_records or ev.logs is None or len(ev.ranks) > 1 or ev.events.of(*_FAILURES):
            return None  # (no logs and no records: a run folder where nothing was recorded says so itself)
        seen = f"the loss of rank {ev.ranks[0]} only" if ev.ranks else "no per-rank training loss"
        evidence = [f"this log holds {seen} and no failure a rule could name: replicas cannot be compared from it"]
        evidence.extend(_holdings(ev))
        evidence.append("next: syncdoctor run -- <launcher ...>, then syncdoctor diagnose <run folder>")
        return self.found(0.5, evidence)


def _holdings(ev: Evidence) -> list[str]:
    """What the log holds when no rule could read a cause from it, and what would tell."""
    logs = ev.logs
    if logs is None:
        return []
    out = [f"read: {logs.n_lines} lines in {len(logs.files)} file(s)"]
    marked = [
        e for e in ev.events.all if e.kind in ("error", "warning", "overflow", "exit", "retry") and e.kind != "info"
    ]
    if marked:
        kinds = Counter(e.kind for e in marked)
        first = marked[0]
        out.append(
            "lines marked by their logger: "
            + ", ".join(f"{n} {k}" for k, n in kinds.most_common())
            + f"; first: {first.source}:{first.line}: {first.raw[:160]}"
        )
        if any(e.raw.lstrip().startswith("Traceback") for e in marked) and not ev.events.of("crash"):
            out.append("a traceback without its exception line: the line after the last frame would name the failure")
    values = getattr(logs, "values", None)
    if values is not None and values.height:
        keys = values["key"].unique().sort().to_list()
        tail = ", with no training loss" if not ev.losses.height else ""
        out.append(f"numbers printed under {len(keys)} key(s) ({', '.join(keys[:8])}){tail}")
    if not marked and (values is None or not values.height):
        out.append("no loss, no step, no warning or error line: not a training log, or cut before training began")
    out.append(
        "what would tell: every rank's log of the same steps (loss, lr, loss scale, step counters), and the full error"
    )
    return out

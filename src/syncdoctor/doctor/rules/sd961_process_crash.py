from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import first_process_failure, peer_closed
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

_PEER_LOSS = ("connection closed", "connection reset", "broken pipe", "peer", "timed out", "timeout")


class ProcessCrash(Rule):
    """A rank died; the others then failed waiting for it.

    **Symptom:** one rank's log ends with a traceback (out of memory, an exception,
    a signal); every other rank fails later with timeouts or "connection closed"
    errors that blame the network.
    NCCL's "Connection closed by localRank N", msrun's "worker exits with
    exception, kill all other workers" and torchrun's negative exit codes say the
    same: a process ended before the others.

    **Cause:** the first failing rank's own error — OOM, a bug on a rank-specific
    path, a killed process — not the communication library.

    **Quick check:** sort the ranks' last error lines by time; the earliest that is
    not a communication error is the cause.

    **Fix:** fix the first failing rank's own error (out of memory: a smaller batch or
    activation checkpointing; otherwise the exception in its traceback); the other
    ranks' communication errors are its consequence.
    """

    code = "SD961"
    name = "process-crash"
    category = "process.crash"
    stage = "process"
    title = "A rank crashed and took the job down"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        first = first_process_failure(ev.events.all)
        if first is None and ev.events.first_failure is not None:
            # a crash after the first timeout: likely a consequence of it
            first = ev.events.first_failure
            consequence = True
        else:
            consequence = False
        if first is None:
            early = [r for r in ev.events.ended_early if r not in {e.rank for e in ev.events.real}]
            if ev.records is not None and early and len(early) < len(ev.ranks):
                return self.found(
                    0.55,
                    [
                        f"{fmt_ranks(early)} stopped writing records without an end record "
                        "and left no error (killed: SIGKILL, OOM killer?)"
                    ],
                    ranks=early,
                    step=min(int(ev.step_counts.get(r, 0)) for r in early),
                )
            return None
        low = first.raw.lower()
        peer = peer_closed(first.raw)
        own_error = not any(w in low for w in _PEER_LOSS)
        if consequence:
            confidence = 0.4
        elif first.kind == "oom":
            confidence = 0.9
        elif peer is not None or first.kind == "exit":
            confidence = 0.8
        else:
            confidence = 0.75 if own_error else 0.4
        who = f"rank {first.rank}" if first.rank is not None else "rank ?"
        if peer is not None:
            evidence = [
                f"first failure: NCCL saw local rank {peer}'s process close its connection "
                f"({first.source}:{first.line}): that process ended before the others"
            ]
        else:
            evidence = [f"first failure: {who}: {first.source}:{first.line}: {first.raw[:200]}"]
        if consequence:
            evidence.append("but a communication timeout came before it: the crash may be its consequence")
        others = [e for e in ev.events.of("timeout", "network", "watchdog") if e.rank != first.rank]
        if others and not consequence:
            evidence.append(
                f"then {len(others)} communication errors on "
                f"{fmt_ranks({e.rank for e in others if e.rank is not None}) or 'other ranks'}: consequences, not causes"
            )
        return self.found(confidence, evidence, ranks=[first.rank] if first.rank is not None else [], step=first.step)

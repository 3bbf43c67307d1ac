from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import first_process_failure
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


def _is_retry(raw: str) -> bool:
    text = raw.lower()
    return "retry" in text or "reconnect" in text


class CommunicationFault(Rule):
    """Collectives time out or the links between ranks fail.

    **Symptom:** watchdog/collective timeouts, "connection closed/reset", NCCL/HCCL
    network errors — the job stops, or worse, retries and carries on.

    **Cause:** a rank stalled (slow storage, a deadlock, a long evaluation on one
    rank), the network or driver failed, or a peer died first (then see the crash
    finding).

    **Quick check:** find the first rank whose log stops or errors; compare
    timestamps of the first timeout on every rank.

    **Fix:** find the rank that stalled or lost its link (the first timeout, the last
    log line) and fix it: move rank-0-only work (saving, evaluation) out of the
    collective path, raise the timeout only for known-long phases, check storage,
    network and driver; restart from the last checkpoint.
    """

    code = "SD951"
    name = "communication-fault"
    category = "comm.fault"
    stage = "comm"
    title = "Collective communication failed or timed out"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        # A timeout that was retried or reconnected is a retry: the job went on.
        hard = [e for e in ev.events.of("timeout", "watchdog", "network") if not _is_retry(e.raw)]
        retries = [e for e in ev.events.of("retry", "timeout", "network") if _is_retry(e.raw)]
        if (
            hard
            and ev.records is not None
            and ev.records.ends
            and all(end.get("status") == "ok" for end in ev.records.ends.values())
            and not ev.events.ended_early
        ):
            retries, hard = hard + retries, []  # every rank finished: they did not stop the job
        if not hard and not retries:
            return None
        if hard:
            first = min(hard, key=lambda e: (e.t is None, e.t or 0))
            ranks = sorted({e.rank for e in hard if e.rank is not None})
            silent = self._silent_ranks(ev, ranks)
            evidence = [
                f"{len(hard)} timeout/network events on {fmt_ranks(ranks) if ranks else 'unknown ranks'}; "
                f"first: {first.source}:{first.line}: {first.raw[:180]}"
            ]
            if silent:
                evidence.append(
                    f"{fmt_ranks(silent)} reported no communication error: the stalled peer the others waited for"
                )
            confidence = 0.8
            finished = self._finished_ranks(ev)
            if finished and set(finished) != set(ev.ranks):
                # A peer that exited normally while others still waited: one side made
                # more collectives (uneven steps), the network did nothing wrong.
                confidence = 0.5
                evidence.append(
                    f"{fmt_ranks(finished)} finished normally while the others still waited for "
                    "them: the ranks did not make the same number of collectives"
                )
            picture = ev.events.hang_picture
            quiet = [r for r, i in picture.items() if i["wait"] is None and not i["ended"]]
            if quiet and not finished and len(set(i["last_step"] for i in picture.values())) == 1:
                # From logs: a rank at the same step that never waited nor failed left
                # the loop normally; the closed connection followed (SD402 says so).
                confidence = min(confidence, 0.6)
            if ev.reduce.sync_apart is not None:
                # Upstream of the collective: the ranks disagreed about which backward
                # all-reduces (SD411), so their collectives could not pair.
                confidence = min(confidence, 0.45)
                evidence.append(
                    "but the ranks disagreed about which micro-steps synchronise before it: the timeouts are the "
                    "consequence"
                )
            crashed_first = first_process_failure(ev.events.all)
            if crashed_first is not None:
                confidence = 0.45  # a peer died first: the timeouts are its consequence
                evidence.append(
                    f"but {crashed_first.source}:{crashed_first.line} shows a process ending first "
                    f"({crashed_first.kind}): the timeouts are its consequence"
                )
            return self.found(confidence, evidence, ranks=silent or ranks, step=first.step)
        return self.found(
            0.3,
            [
                f"{len(retries)} retries/reconnects; first: {retries[0].source}:{retries[0].line}: "
                f"{retries[0].raw[:180]}",
                "a retry that 'succeeds' may have left a rank out of the average; compare replicas",
            ],
            ranks=sorted({e.rank for e in retries if e.rank is not None}),
            step=retries[0].step,
            # Retries matter when replicas part; in a healthy run they are a note.
            severity="warning" if ev.replicas.divergence else "info",
            title="Communication retries",
        )

    @staticmethod
    def _finished_ranks(ev: Evidence) -> list[int]:
        if ev.records is not None and ev.records.ends:
            return sorted(
                r
                for r, end in ev.records.ends.items()
                if end.get("status") == "ok" and not any(c.get("rank") == r for c in ev.replicas.incomplete_checks)
            )
        return []

    @staticmethod
    def _silent_ranks(ev: Evidence, complaining: list[int]) -> list[int]:
        known = set(ev.ranks)
        if not complaining or len(known) < 2:
            return []
        return sorted(known - set(complaining))

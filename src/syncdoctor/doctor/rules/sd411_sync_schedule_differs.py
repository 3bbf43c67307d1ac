from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement
from syncdoctor.rulebook import fmt_ranks


class SyncScheduleDiffers(Rule):
    """The ranks disagree about which micro-steps synchronise.

    **Symptom:** a hang in the first synchronised backward until the process group's
    timeout (then "Timed out waiting … for recv", "Connection closed by peer"), or no
    error and replicas that part while the step counters look alike.

    **Cause:** the gradient-accumulation schedule differs across ranks: an
    `accumulate_grad_batches` / `gradient_accumulation_steps` read from a per-node
    config, a `no_sync()` or `require_backward_grad_sync` under a rank-dependent
    condition, an accumulation counter that restarts differently per rank. One rank
    all-reduces in a backward where another does not: DDP's all-reduce pairs with
    whatever collective the other rank makes next (the wrong micro-step's, a
    broadcast, none at all).

    Not this: one rank splits each update into more, smaller micro-batches than the
    others (a smaller batch where memory is short, compensated by accumulation) with
    the same samples and the same synchronised call per update on every rank; the
    all-reduces pair one to one (SD402 notes the different layout).

    **Quick check:** print `model.require_backward_grad_sync` at every forward of
    the DDP model on every rank: the sequences differ.

    **Fix:** give every rank the same accumulation schedule: one config that every
    node reads alike (or broadcast rank 0's value at start-up), and a `no_sync`
    condition that depends only on the micro-step index, never on the rank.
    """

    code = "SD411"
    name = "sync-schedule-differs"
    category = "sync.step_misalignment"
    stage = "sync_schedule"
    title = "Ranks disagree about which micro-steps synchronise"
    sources = ("records", "ends")

    def evaluate(self, ev: Evidence) -> Finding | None:
        apart = ev.reduce.sync_apart
        if apart is None:
            return None
        if not apart.at_end and ev.reduce.same_work_per_update is not None:
            # The schedules differ only in how many no_sync calls come before the one
            # synchronised call: the all-reduces pair one to one and every update reads
            # an averaged gradient of as many samples on every rank (SD402 notes the layout).
            return None
        synced = sorted(r for r, s in apart.synced.items() if s)
        unsynced = sorted(r for r, s in apart.synced.items() if not s)
        schedules = ", ".join(f"rank {r} {apart.schedules[r]!r}" for r in sorted(apart.schedules))
        evidence = [
            f"backward call {apart.call} of update {apart.step}: DDP all-reduced on {fmt_ranks(synced)}, "
            f"{fmt_ranks(unsynced)} ran it inside no_sync (per call: s all-reduced, n no_sync: {schedules})",
        ]
        if apart.at_end:
            evidence.append(
                "the ranks stopped in those calls: the all-reduce one side made had no matching collective on "
                "the other, so any timeout or closed connection that followed is the consequence"
            )
        div = ev.replicas.divergence
        if div is not None and not apart.at_end:
            evidence.append(f"the replicas part at step {div.step}")
        split = agreement({r: apart.schedules[r] for r in apart.schedules})
        ranks = split.odd if split.has_majority else sorted(apart.schedules)
        return self.found(0.93, evidence, ranks=ranks, step=apart.step, direct=True)

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class UpdateWithoutReduce(Rule):
    """An optimizer step read gradients that no all-reduce averaged.

    **Symptom:** no error and no hang (every rank skipped the same all-reduce, so the
    collectives still pair); the replicas part at the first such update, often once
    per epoch or once per accumulation cycle, while the sync schedules agree across
    ranks. (A script that keeps DDP inside `no_sync` on purpose and averages the
    gradients itself with `dist.all_reduce` is counted too: the probe reads DDP's own
    flag, and a hand-written reduce beside a DDP wrapper is not matched to the update.)
    Without a DDP wrapper (a loop that averages each gradient with `dist.all_reduce`
    itself), an update with no synchronous all_reduce of a gradient since the previous
    update is counted, once an earlier update of that loop had one. It cannot tell: a
    reduce it does not see (a flat buffer or a bucket that is no `p.grad`, an
    `async_op=True` call, another comm library, an `all_reduce` bound before the
    probe's patch): a loop reducing only that way counts nothing, and one that mixes
    it with a plain call on `p.grad` in another phase counts that phase's updates; an
    unreduced phase that runs before the first reducing update, which is counted from
    its next occurrence on; and a local step on purpose (local SGD's updates between
    averagings are not counted only because they average parameters, not gradients).

    **Cause:** every `backward()` since the previous update ran inside DDP's
    `no_sync()`: the flag that decides when to synchronise is off by one (the last
    micro-batch of an epoch flushes the optimizer but still counted as an accumulation
    step), `no_sync` wraps the whole accumulation loop including its last micro-step,
    or `require_backward_grad_sync` is left False after an evaluation or a warm-up. In a
    hand-written loop, a second phase (a lazy regulariser such as StyleGAN2's R1 every
    few steps, an auxiliary loss with its own step) calls backward() and step() but not
    the function that averages the gradients. Each rank then steps with its own local
    gradient.

    **Quick check:** print `model.require_backward_grad_sync` right before each
    `loss.backward()`, and when `optimizer.step()` runs: an update with no True since
    the previous one is the bug. In a hand-written loop, count the all_reduce calls
    between each `backward()` and `optimizer.step()`: a step after none is the bug.

    **Fix:** decide the sync flag from the same condition that decides the optimizer
    step (`sync = (micro + 1) % accum == 0 or last_batch`), and run that micro-step's
    forward and backward outside `no_sync`; accelerate's `accumulate()` and Lightning
    do this for you. In a hand-written loop, average the gradients (the same
    `all_reduce` and division) in every phase that steps the optimizer.
    """

    code = "SD413"
    name = "update-without-reduce"
    category = "sync.incomplete_reduce"
    stage = "sync_schedule"
    title = "An update read gradients that no all-reduce averaged"

    def evaluate(self, ev: Evidence) -> Finding | None:
        unsynced = ev.reduce.unsynced_updates
        if unsynced is None:
            return None
        ranks = sorted(unsynced.count)
        everywhere = set(ranks) == set(ev.ranks)
        first = min(unsynced.first.values())
        counts = ", ".join(f"{unsynced.count[r]} on rank {r} (first at step {unsynced.first[r]})" for r in ranks)
        what = (
            "updates with no all_reduce call of a gradient between the backward() and the update, in a loop "
            "that all-reduced its gradients before an earlier update (no DDP wrapper)"
            if unsynced.hand_written
            else "updates whose backward() calls all ran inside no_sync"
        )
        evidence = [
            f"by the check at step {unsynced.step}, {what}: "
            f"{counts}: the optimizer stepped with {'each rank' if everywhere else fmt_ranks(ranks)}'s "
            "own local gradients",
        ]
        if everywhere:
            evidence.append(
                "every rank skipped the same all-reduce, so the collectives still paired: no hang and no "
                "disagreement about the schedule, only updates from different gradients"
            )
        culprits = [] if everywhere else ranks
        div = ev.replicas.divergence
        if div is not None:
            evidence.append(f"the replicas part at step {div.step}")
        elif everywhere:
            # Local gradients that happened to be equal (the same batch on every rank) part nothing.
            evidence.append("the replicas have not parted at any check: the ranks' local gradients were equal")
            return self.found(0.6, evidence, ranks=culprits, step=first, severity="warning")
        return self.found(0.93, evidence, ranks=culprits, step=first, direct=True)

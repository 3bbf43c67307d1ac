from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.ingest.meaning import mismatch_ranks, no_grad_rank, stalled_ranks
from syncdoctor.doctor.model import Event, Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

# What the libraries say when ranks did not issue the same collectives.
_CONTROL_FLOW = (
    "mismatch between collectives",
    "mismatched collective",
    "expected to have finished reduction",
    "did not receive grad",
    "were not used in producing loss",
    # DDP: a parameter's gradient hook fired twice (reentrant checkpointing)
    "mark a variable ready only once",
    "marked as ready twice",
    # Horovod: the ranks asked for the same collective with different tensors
    "mismatched allreduce",
    "mismatched allgather",
    "mismatched broadcast",
    "unused parameters",
    "find_unused_parameters",
    "collective sequence number",
    "opcount",
    "different sequence",
    # Horovod: a subset of ranks submitted a tensor the others never did
    "subset of ranks",
    "stalled ops",
    "missing ranks:",
    "ready ranks:",
)


class CollectiveMismatch(Rule):
    """Ranks issued different collectives: rank-dependent control flow.

    **Symptom:** "Detected mismatch between collectives", NCCL's "Mismatched
    collective detected", DDP's "Expected to have finished reduction in the prior
    iteration" / "Parameters which did not receive grad for rank N", Horovod's
    "tensors were submitted ... by subset of ranks ... [missing ranks: 1]", or a
    hang where one rank waits in a collective the others never reach (evaluation
    or saving on rank 0 only, a conditional all-gather).

    **Cause:** a branch that depends on the rank or on local data around a
    collective, `optimizer.step()` or the model's used parameters: not the network.

    **Quick check:** TORCH_DISTRIBUTED_DEBUG=DETAIL (slow; segfaults in DDP's constructor on some CPU builds) names the ranks and ops;
    Horovod's stall report names the missing ranks.

    **Fix:** make every rank execute the same collectives in the same order: remove
    rank- or data-dependent branches around collectives and `optimizer.step()`; for
    conditional branches inside the model use `find_unused_parameters=True`.
    """

    code = "SD404"
    name = "collective-mismatch"
    category = "sync.control_flow"
    stage = "sync_schedule"
    title = "Ranks issued different collectives"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        hits = [
            e
            for e in ev.events.real
            if e.kind in ("mismatch", "crash", "configuration") and any(w in e.raw.lower() for w in _CONTROL_FLOW)
        ]
        if not hits:
            return None
        ranks, meaning = self._who(hits)
        evidence = ([meaning] if meaning else []) + [f"{e.source}:{e.line}: {e.raw[:200]}" for e in hits[:4]]
        return self.found(0.85, evidence, ranks=sorted(ranks), step=hits[0].step)

    @staticmethod
    def _who(hits: list[Event]) -> tuple[set[int], str]:
        """The ranks the messages name, and what they mean."""
        missing: set[int] = set()
        ready: set[int] = set()
        no_grad: set[int] = set()
        named: set[int] = set()
        for e in hits:
            m, r = stalled_ranks(e.raw)
            missing |= m
            ready |= r
            if (rank := no_grad_rank(e.raw)) is not None:
                no_grad.add(rank)
            named |= mismatch_ranks(e.raw)
        if missing:
            return missing, (
                f"Horovod: {fmt_ranks(missing)} never submitted collectives the other ranks were "
                "waiting in: they took a different code path"
            )
        if ready:
            return ready, (
                f"Horovod: only {fmt_ranks(ready)} submitted some collectives; the rest never did "
                "(a rank-dependent branch, or ranks building different tensors)"
            )
        if no_grad:
            return no_grad, (
                f"DDP: parameters on {fmt_ranks(no_grad)} received no gradient in an iteration, so "
                "the gradient reduction could not complete: the forward pass used a different "
                "set of parameters (a conditional branch or an unused layer)"
            )
        if named:
            return named, f"{fmt_ranks(named)} issued collectives that differ from each other's"
        return {e.rank for e in hits if e.rank is not None}, ""

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement
from syncdoctor.rulebook import fmt_ranks


class GradientsMissingOnSomeRanks(Rule):
    """The update reads gradients for different parameters on different ranks.

    **Symptom:** no error; the replicas part, first in the parameters of a branch, a
    head or an expert that the model uses for some batches only, while step counters
    and configuration agree.

    **Cause:** the averaged gradient did not reach `p.grad` on every rank. A
    hand-written average that reduces a stand-in for a missing gradient
    (`torch.zeros_like(p)`) and never assigns it back, `requires_grad` switched on one
    rank only, or a loss term some ranks add after the average: the ranks that hold
    the gradient update those parameters, the others leave them as they are. DDP fills
    such gradients by itself; a hand-written reduction must too.

    **Quick check:** right before `optimizer.step()`, print
    `[n for n, p in model.named_parameters() if p.grad is None]` on every rank: the
    lists differ.

    **Fix:** write the reduced tensor back (`p.grad = buffer`), or give every
    parameter a gradient before the average (`p.grad = torch.zeros_like(p)` where it is
    None), on every rank alike; or let DDP reduce (`find_unused_parameters=True` for a
    branch some batches skip).
    """

    code = "SD410"
    name = "gradients-missing-on-some-ranks"
    category = "sync.incomplete_reduce"
    stage = "backward"
    title = "Gradients missing on some ranks: the ranks update different parameters"

    def evaluate(self, ev: Evidence) -> Finding | None:
        apart = ev.reduce.gradients_apart
        if apart is None:
            return None
        split = agreement({r: (m, apart.first.get(r)) for r, m in apart.missing.items()})
        if split.has_majority:
            odd = split.odd
        else:  # two ranks: the ones that lack gradients the others hold
            odd = [r for r, m in apart.missing.items() if m == max(apart.missing.values())]
        named = next((apart.first[r] for r in odd if r in apart.first), None)
        counts = ", ".join(f"{apart.missing[r]} on rank {r}" for r in sorted(apart.missing))
        when = f"between the checks at steps {apart.since} and {apart.step}" if apart.since else f"by step {apart.step}"
        evidence = [
            f"{when} the updates read no gradient for different parameters on different ranks (missing "
            f"gradients: {counts})" + (f"; one of them: {named}" if named else ""),
            f"{fmt_ranks(odd)} "
            + (
                "did not update parameters that the other ranks updated"
                if all(apart.missing[r] >= max(apart.missing.values()) for r in odd)
                else "updated parameters that the other ranks held no gradient for"
            ),
        ]
        div = ev.replicas.divergence
        if div is not None:
            where = "from that check on" if div.step >= apart.step else "before it"
            evidence.append(f"the replicas part at step {div.step}, {where}")
        return self.found(0.92, evidence, ranks=sorted(odd), step=apart.step, tensor=named, direct=True)

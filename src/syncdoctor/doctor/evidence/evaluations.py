"""What every rank evaluated after its last training step, read from the logs, and the
trend of the ranks' loss gaps (doctor/must_equal.py): equal replicas evaluating the
same data print the same result."""

from __future__ import annotations

from functools import cached_property

from syncdoctor.doctor.evidence.loss import Loss
from syncdoctor.doctor.evidence.sources import Facet, Sources
from syncdoctor.doctor.must_equal import Drift, EvalParting, final_evaluations, loss_drift
from syncdoctor.records.compare import describe_split


class Evaluations(Facet):
    """``ev.evaluations``: final evaluations that differ across ranks (logs only)."""

    def __init__(self, ev: Sources, loss: Loss) -> None:
        super().__init__(ev)
        self.loss = loss

    @cached_property
    def parted(self) -> list[EvalParting]:
        """The evaluations every rank printed at the end that differ (none from records:
        there the replicas themselves are compared)."""
        logs = self.ev.logs
        if logs is None or self.ev.has_records:
            return []
        return final_evaluations(logs.values, logs.losses)

    @cached_property
    def drift(self) -> Drift | None:
        """Whether the ranks' loss gaps grew over the run, where evaluations parted."""
        return loss_drift(self.loss.wide) if self.parted and self.loss.wide.height else None

    def describe(self) -> str:
        """The first parted evaluation in words, for a finding's evidence."""
        parted = self.parted
        first = parted[0]
        others = f" (also {', '.join(p.key for p in parted[1:4])})" if len(parted) > 1 else ""
        return (
            f"every rank evaluated after its last training step and the results differ: `{first.key}` "
            f"{describe_split(first.values)} ({first.spread:.1%} apart; {first.source}:{first.line}){others}; "
            "equal replicas evaluating the same data print the same result"
        )

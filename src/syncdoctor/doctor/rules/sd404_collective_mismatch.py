from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule

_CONTROL_FLOW = ("mismatch between collectives", "expected to have finished reduction",
                 "unused parameters", "find_unused_parameters", "collective sequence number",
                 "opcount", "different sequence")


class CollectiveMismatch(Rule):
    """Ranks issued different collectives: rank-dependent control flow.

    **Symptom:** "Detected mismatch between collectives", DDP's "Expected to have
    finished reduction in the prior iteration", or a hang where one rank waits in a
    collective the others never reach.

    **Cause:** a branch that depends on the rank or on local data around a
    collective, `optimizer.step()` or the model's used parameters.

    **Quick check:** TORCH_DISTRIBUTED_DEBUG=DETAIL (slow; segfaults in DDP's constructor on some CPU builds) names the ranks and ops.

    **Fix:** make every rank execute the same collectives in the same order;
    `find_unused_parameters=True` for conditional branches in the model.
    """

    code = "SD404"
    name = "collective-mismatch"
    category = "sync.control_flow"
    title = "Ranks issued different collectives"
    fix = "Remove rank- or data-dependent branches around collectives and optimizer.step(); for conditional model branches use find_unused_parameters=True."
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        hits = [e for e in ev.real_events if e.kind in ("mismatch", "crash", "configuration")
                and any(w in e.raw.lower() for w in _CONTROL_FLOW)]
        if not hits:
            return None
        ranks = sorted({e.rank for e in hits if e.rank is not None})
        return self.found(0.85, [f"{e.source}:{e.line}: {e.raw[:200]}" for e in hits[:4]],
                          ranks=ranks, step=hits[0].step)

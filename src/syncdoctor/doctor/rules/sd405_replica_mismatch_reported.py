from __future__ import annotations

import re

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule

_MISMATCH = re.compile(r"(gradient|parameter|param|weight)s?\s+(gradient\s+)?mismatch|GRADIENT_SYNC", re.I)


class ReplicaMismatchReported(Rule):
    """A log reports that replicas or gradients differ across ranks.

    **Symptom:** lines such as `[ERROR] GRADIENT_SYNC: Rank 0 and Rank 1 parameter
    gradient mismatch at step 1200`, or a syncdoctor check line.

    **Cause:** the replicas are no longer identical; the report alone does not say
    why. Probe records name the mechanism (counters, reduced gradients, optimizer
    state, initial weights).

    **Quick check:** rerun with `syncdoctor run -- <launcher>` to get the first
    differing step, ranks and tensor.

    **Fix:** find where the replicas part: run under the probe (`syncdoctor run --
    <launcher>`) to get the first differing step, ranks and tensor, and follow that
    finding. Without records, check in order: seeds and sharding, rank ids,
    loss/optimizer settings per rank, communication logs.
    """

    code = "SD405"
    name = "replica-mismatch-reported"
    category = "sync.incomplete_reduce"
    stage = "params"
    title = "Logs report replicas out of sync"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        if ev.replicas.divergence is not None:
            return None  # records already pin it down
        hits = [e for e in ev.events.real if e.kind == "mismatch" and _MISMATCH.search(e.raw)]
        if not hits:
            return None
        ranks = sorted({int(r) for e in hits for r in re.findall(r"rank\s*(\d+)", e.raw, re.I)})
        steps = [int(m) for e in hits for m in re.findall(r"step\s*[:=]?\s*(\d+)", e.raw, re.I)]
        return self.found(
            0.55,
            [f"{e.source}:{e.line}: {e.raw[:200]}" for e in hits[:4]],
            ranks=ranks,
            step=min(steps) if steps else hits[0].step,
        )

from __future__ import annotations

import polars as pl

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class UncoveredGradients(Rule):
    """Parameters receive gradients that DDP's all-reduce never averages.

    **Symptom:** no error; from some step on the replicas part, often slowly, while
    step counters and configuration agree. The first parameters to differ are the
    ones the script changed after wrapping the model: a backbone it unfroze, a head
    it replaced, a layer it added.

    **Cause:** `DistributedDataParallel` decides once, in its constructor, which
    parameters its reducer averages: those that required a gradient then. A parameter
    frozen at that moment and unfrozen later, or one created after the wrap
    (`model.module.fc = nn.Linear(...)`), gets a gradient that each rank applies on
    its own, unaveraged. So does a parameter the optimizer updates outside the wrapped
    module (learnable loss weights, a criterion's temperature).

    **Quick check:** after the change, compare each rank's gradient of one of those
    parameters right after `backward()`: they differ.

    **Fix:** build (or rebuild) the DDP wrapper after changing which parameters train:
    unfreeze or replace first, then `DDP(model)`; or keep every parameter trainable
    from the start and zero the gradients of the frozen ones; put learnable loss
    weights inside the module DDP wraps.
    """

    code = "SD409"
    name = "uncovered-gradients"
    category = "sync.incomplete_reduce"
    stage = "reducer"
    title = "Gradients that no all-reduce averages: parameters trained outside DDP's reducer"

    def evaluate(self, ev: Evidence) -> Finding | None:
        if not ev.has_records or "uncovered_grads" not in ev.steps.columns:
            return None
        rows = ev.steps.filter(pl.col("uncovered_grads").fill_null(0) > 0).sort("step")
        if not rows.height:
            return None
        step = int(rows["step"][0])
        ranks = sorted({int(r) for r in rows.filter(pl.col("step") == step)["rank"].to_list()})
        count = int(rows["uncovered_grads"][0])
        first = rows["uncovered_first"][0] if "uncovered_first" in rows.columns else None
        evidence = [
            f"at step {step} {count} parameter{'s' if count != 1 else ''} held a gradient that DDP's reducer does "
            f"not average on {fmt_ranks(ranks)}"
            + (f" (first: {first})" if first else "")
            + ": they required no gradient or did not exist when the wrapper was built, or live outside the"
            " wrapped module"
        ]
        div = ev.replicas.divergence
        if div is not None and div.step >= step:
            evidence.append(f"the replicas part at step {div.step}, where those gradients were seen or after")
        return self.found(0.92, evidence, ranks=ranks, step=step, tensor=first)

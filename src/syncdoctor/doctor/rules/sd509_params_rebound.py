from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks


class ParamsRebound(Rule):
    """On some ranks the model no longer computes with the parameters that DDP and the
    optimizer hold: they were replaced by new tensors outside the update.

    **Symptom:** no error; the replicas part between two checks, often at a round step
    where rank 0 exports, quantises or evaluates, and often in a few tensors only (the
    ones replaced), which looks like a flipped bit. The loss may keep falling.

    **Cause:** code under a rank branch rebound the live parameters: a pruned export
    made from the training model itself (`torch.nn.utils.prune.l1_unstructured` then
    `prune.remove` on `model.module`: `remove` puts the masked weights into the
    parameter with `p.data = ...`), `module.weight = nn.Parameter(...)` after the wrap,
    `load_state_dict(..., assign=True)`, `model.half()` for an export. The new tensors
    are not the ones the all-reduce and the optimizer update alike on every rank, and
    torch's version counters do not count a `.data` swap or a new object. The probe
    compares, at each check, the module's parameters with the objects it watches and
    each one's storage with the last check's: the counts differ across ranks.

    **Quick check:** on every rank, before and after the suspect block, print
    `[(n, id(p), p.data_ptr()) for n, p in model.module.named_parameters()]`: they
    change on the named ranks only.

    **Fix:** export, prune or quantise a copy (`copy.deepcopy(model.module)`, or the
    state_dict's tensors cloned), never the training model; replace parameters, if you
    must, on every rank alike and before building DDP and the optimizer (or rebuild
    both after it).
    """

    code = "SD509"
    name = "params-rebound"
    category = "model.init_mismatch"
    stage = "bindings"
    title = "Parameters replaced outside the update on some ranks: the model no longer uses what the update holds"

    def evaluate(self, ev: Evidence) -> Finding | None:
        rebound = ev.replicas.rebound
        if rebound is None:
            return None
        others = sorted(set(rebound.counts) - set(rebound.ranks))
        tensor = f" (first: {rebound.first})" if rebound.first else ""
        since = (
            f"between the checks at steps {rebound.since} and {rebound.step}"
            if rebound.since is not None
            else f"by the check at step {rebound.step}"
        )
        counts = ", ".join(str(rebound.counts[r]) for r in rebound.ranks)
        usual = ", ".join(sorted({str(rebound.counts[r]) for r in others})) or "0"
        evidence = [
            f"{since}, parameters of {fmt_ranks(rebound.ranks)} were replaced by new tensors outside the update"
            f"{tensor}: {counts} replaced so far against {usual} on the other ranks (a new parameter object, or new "
            "storage through `p.data = ...`, as prune.remove, an assignment after the wrap, "
            "load_state_dict(assign=True) or half() make), which the update does not write alike on every rank",
        ]
        div = ev.replicas.divergence
        if div is not None:
            first = f", first at {div.tensor}" if div.tensor else ""
            evidence.append(f"the replicas part at step {div.step}{first}")
        confidence = 0.93 if div is not None and div.step >= rebound.step else 0.85
        return self.found(
            confidence, evidence, ranks=rebound.ranks, step=rebound.step, tensor=rebound.first, direct=True
        )

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

LABELS = {"param": "parameters", "opt": "optimizer state", "buffer": "buffers", "grad": "reduced gradients"}


class RebuiltStateMismatch(Rule):
    """A model rebuilt in the middle of the run resumed from different state on different ranks.

    **Symptom:** the replicas were bitwise equal up to a checkpoint, then the script
    rebuilt its model, wrapper or optimizer in the same process (to resume, to change
    the wrapper, after an evaluation) and loaded state into them; from the first check
    after that, the ranks disagree while step counters and configuration agree. No error.

    **Cause:** the state went into the new objects differently on each rank: a
    checkpoint loaded on rank 0 only (`if rank == 0: model.load_state_dict(...)`)
    after DDP's constructor already broadcast the unloaded weights, an optimizer state
    loaded on some ranks, or each rank reading its own checkpoint file. DDP broadcasts
    parameters once, in its constructor: what is loaded after it is never synchronised.

    **Quick check:** print a checksum of the parameters and of the optimizer state on
    every rank right after loading.

    **Fix:** load the same checkpoint on every rank (`map_location` to the local
    device) before wrapping the model in DDP, and load the optimizer state on every
    rank; or broadcast rank 0's parameters and optimizer state after loading.
    """

    code = "SD505"
    name = "rebuilt-state-mismatch"
    category = "model.init_mismatch"
    stage = "bindings"
    title = "A rebuilt model resumed from different state on different ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if div is None or not div.what or "counter" in div.what or "config" in div.what:
            return None
        rebuilt = ev.events.rebuilt_within(div.last_agree_step, div.step)
        if rebuilt is None:
            return None
        parted = ", ".join(LABELS.get(w, w) for w in div.what)
        tensor = f" (first: {div.tensor})" if div.tensor else ""
        agreed = (
            f"the replicas agreed at step {div.last_agree_step}, before it"
            if div.last_agree_step is not None
            else "no check agreed before it"
        )
        evidence = [
            f"the model was rebuilt after step {rebuilt} (a new wrapper or optimizer over the same "
            f"parameters: the probe's record goes on in a new segment); {agreed}",
            f"{fmt_ranks(div.ranks)} differ at step {div.step}, the first check after the rebuild: "
            f"{parted}{tensor}, while step counters and configuration agree",
        ]
        return self.found(0.9, evidence, ranks=div.ranks, step=div.step, tensor=div.tensor)

from __future__ import annotations

from typing import Any

from syncdoctor.doctor.evidence import Evidence, int_of
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import describe_split
from syncdoctor.rulebook import fmt_ranks


class InitMismatch(Rule):
    """Replicas start from different weights.

    **Symptom:** ranks disagree from the very first step and never agree; the loss
    is noisy and accuracy stays below single-card.

    **Cause:** no common seed before building the model and no parameter
    broadcast at start. MindSpore does not broadcast parameters (GRAPH mode's
    `parameter_broadcast=True` does; PyNative ignores it); a hand-written PyTorch
    loop does not either, and DDP's broadcast hides an unseeded init.

    Also when the weights were equal at the DDP wrap and a checkpoint or pretrained
    state was loaded on some ranks only after it: the wrap's broadcast is already over.

    **Quick check:** print a checksum of the first layer's weights on every rank before step 1.

    **Fix:** seed every rank identically before creating the model (`ms.set_seed(s)` and
    `ds.config.set_seed(s)`; `torch.manual_seed(s)`), or broadcast rank 0's parameters
    at start; load a checkpoint on every rank, or before wrapping the model.
    """

    code = "SD501"
    name = "init-mismatch"
    category = "model.init_mismatch"
    stage = "init"
    title = "Replicas started from different weights"

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence = []
        ranks: list[int] = []
        initial = ev.replicas.initial_weights()
        init = initial is not None and initial[1] > 1
        if initial is not None and init:
            odd, distinct, compared = initial
            where = " within replica groups" if ev.placement.replica else ""
            evidence.append(
                f"parameters differ before the first update{where}: {distinct} distinct initial "
                f"weights across {compared} ranks"
            )
            ranks = odd
        elif initial is not None and initial[2] == len(ev.snapshots):
            return None  # every rank started from the same weights: whatever parted came later
        div = ev.replicas.divergence
        first_step = int_of(ev.steps["step"].min()) if ev.has_records else None
        if not init and div and "param" in div.what and "counter" not in div.what and div.step == first_step:
            if ev.differing("optimizer", "param_groups") or ev.differing("loss", "params"):
                return None  # a configuration seen different at start explains a first update that differs
            evidence.append(
                f"parameters differ at the first recorded step ({div.step}, after its update) with "
                f"identical counters; {fmt_ranks(div.ranks)} disagree"
            )
            ranks = div.ranks
        if not evidence:
            return None
        seeds = ev.differing("seed", "torch_initial_seed") or ev.differing("seed", "ms_seed")
        if seeds:
            evidence.append("seeds differ: " + describe_split(seeds))
        # Weights equal at the wrap that changed on some ranks before the first update:
        # loaded, not drawn, so the seeds and generators say nothing about it.
        changed = sorted(r for r, v in ev.snapshot_values("init_params_changed").items() if v) if init else []
        if changed:
            evidence.append(
                f"the weights were equal at the DDP wrap (after its broadcast) and changed on {fmt_ranks(changed)} "
                "before the first update: state loaded into the model after the wrap, on some ranks only"
            )
        rng = ev.differing("rng")
        if rng and not seeds and not changed:
            differ = sorted({k for v in rng.values() if isinstance(v, dict) for k in v if _differs(rng, k)})
            if differ:
                evidence.append(f"the random generators' states differed when the probe attached: {', '.join(differ)}")
        local = ev.differing("init_param_fp_local")
        if local:
            evidence.append(
                "each rank built its own weights before the start-up broadcast "
                f"({len(set(local.values()))} distinct): the initialisation is not seeded alike"
            )
        return self.found(
            0.95 if init else 0.7,
            evidence,
            title="Replicas started from different weights: state loaded on some ranks after the wrap"
            if changed
            else None,
            ranks=ranks,
            step=0,
            tensor=div.tensor if div else None,
            direct=bool(init),
        )


def _differs(per_rank: dict[int, Any], key: str) -> bool:
    """Whether `key` of the per-rank dicts holds more than one value."""
    return len({repr(v.get(key)) for v in per_rank.values() if isinstance(v, dict)}) > 1

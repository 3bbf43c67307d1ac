from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule, fmt_ranks


class InitMismatch(Rule):
    """Replicas start from different weights.

    **Symptom:** ranks disagree from the very first step and never agree; the loss
    is noisy and accuracy stays below single-card (forum: 参数初始化不一致).

    **Cause:** no common seed before building the model and no parameter
    broadcast at start. MindSpore does not broadcast parameters (GRAPH mode's
    `parameter_broadcast=True` does; PyNative ignores it); a hand-written PyTorch
    loop does not either, and DDP's broadcast hides an unseeded init.

    **Quick check:** print a checksum of the first layer's weights on every rank before step 1.

    **Fix:** seed every rank identically before creating the model
    (`ms.set_seed(s)` and `ds.config.set_seed(s)`; `torch.manual_seed(s)`), or
    broadcast rank 0's parameters at start.
    """

    code = "SD501"
    name = "init-mismatch"
    category = "model.init_mismatch"
    title = "Replicas started from different weights"
    fix = "Seed every rank identically before building the model (ms.set_seed(s) and ds.config.set_seed(s); torch.manual_seed(s)) or broadcast rank 0's parameters at start."

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence = []
        ranks: list[int] = []
        init = ev.differing("init_param_fp")
        if init:
            groups: dict[object, list[int]] = {}
            for rank, fp in init.items():
                groups.setdefault(fp, []).append(rank)
            evidence.append(f"parameters differ when the probe attached: {len(groups)} distinct initial weights "
                            f"across {len(init)} ranks")
            ranks = ev.ranks if len(groups) == len(init) else sorted(r for g in groups.values() if len(g) == 1 for r in g)
        div = ev.divergence
        first_step = int(ev.steps["step"].min()) if ev.has_records else None
        if div and "param" in div.what and "counter" not in div.what and div.step == first_step:
            evidence.append(f"parameters differ at the first recorded step ({div.step}) with identical counters; "
                            f"{fmt_ranks(div.ranks)} out of step")
            ranks = ranks or div.ranks
        if not evidence:
            return None
        seeds = ev.differing("seed", "torch_initial_seed") or ev.differing("seed", "ms_seed")
        if seeds:
            evidence.append("seeds differ: " + ", ".join(f"rank {r}: {v}" for r, v in sorted(seeds.items())))
        return self.found(0.95 if init else 0.8, evidence, ranks=ranks, step=0,
                          tensor=div.tensor if div else None)

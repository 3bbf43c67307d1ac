from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class OptimizerStateMismatch(Rule):
    """Identical gradients, different updates: the optimizer differs across ranks.

    **Symptom:** the loss curve looks normal but the model does not converge as
    well as on one card; replicas part although the reduced gradients agree
    (quick reference, last row: 对比各卡优化器state_dict).

    **Cause:** an optimizer hyperparameter (lr, momentum, weight decay, betas) or
    its state (momentum buffers, Adam moments, step count) differs on some rank —
    a per-rank config, a state reset or a checkpoint loaded on one rank only.

    **Quick check:** compare `optimizer.state_dict()` hashes across ranks after a step.

    **Fix:** build the optimizer from the same config on every rank and load its
    state on every rank (or broadcast it) after resuming.
    """

    code = "SD601"
    name = "optimizer-state-mismatch"
    category = "optim.state_mismatch"
    title = "Optimizer state or hyperparameters differ across ranks"
    fix = "Build the optimizer identically on every rank and load or broadcast its state on all ranks when resuming; never change hyperparameters on one rank."

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence = []
        groups = ev.differing("optimizer", "param_groups")
        if groups:
            evidence.append("optimizer hyperparameters differ at start: "
                            + "; ".join(f"rank {r}: {v[0] if v else v}" for r, v in sorted(groups.items())))
        div = ev.divergence
        first_step = int(ev.steps["step"].min()) if ev.has_records else None
        state_only = (div is not None and {"param", "opt"} & set(div.what)
                      and not ({"grad", "counter", "mode", "buffer"} & set(div.what)) and div.step != first_step)
        if state_only:
            evidence.append(f"parameters and optimizer state part at step {div.step} while the reduced "
                            "gradients and step counters stay identical")
        if not evidence:
            return None
        if ev.overflow_disagreement:
            return None
        return self.found(0.95 if groups else 0.85, evidence, ranks=div.ranks if div else sorted(groups or {}),
                          step=div.step if div else None, tensor=div.tensor if div else None)

from __future__ import annotations

from typing import Any

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import agreement, describe_split


class ReduceSettingsMismatch(Rule):
    """The data-parallel wrapper reduces gradients differently on some rank.

    **Symptom:** the job fails at its first gradient reduction (buffers of different
    dtypes or sizes meet in one collective), or trains with gradients averaged one way
    on some ranks and another way on the others.

    **Cause:** the wrapper was built from a rank-dependent setting: an FSDP2
    `MixedPrecisionPolicy` (reduce or param dtype) chosen per rank, `gradients_mean`
    set on some ranks only, DDP bucket or gradient-view settings that differ.

    **Quick check:** print the wrapper's settings (`mp_policy`, `gradients_mean`,
    `bucket_cap_mb`) on every rank before the first step.

    **Fix:** build the data-parallel wrapper (FSDP2 mixed-precision policy,
    gradients_mean, DDP bucket settings) from one configuration on every rank.
    """

    code = "SD406"
    name = "reduce-settings-mismatch"
    category = "sync.reduce_op"
    stage = "reduced"
    title = "Gradient reduction configured differently across ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        settings = ev.differing("ddp")
        if not settings:
            return None
        keys = sorted({k for v in settings.values() if isinstance(v, dict) for k in v})
        lines = []
        for key in keys:
            values: dict[int, Any] = {r: (v or {}).get(key) for r, v in settings.items()}
            if len({repr(x) for x in values.values()}) > 1:
                lines.append(f"{key} {describe_split(values, fmt=_short)}")
        if not lines:
            return None
        return self.found(
            0.9,
            ["data-parallel settings differ at start (snapshot before step 1): " + "; ".join(lines)],
            ranks=agreement({r: repr(v) for r, v in settings.items()}).odd,
            direct=True,
        )


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 120 else text[:117] + "..."

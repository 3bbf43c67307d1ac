"""The canary forward end to end: real lab runs (2 ranks over gloo) name the first
layer whose output parts on a fixed batch, and the specific cause stays on top."""

from __future__ import annotations

import pytest

from syncdoctor.doctor.diagnose import diagnose

# fault -> (the first differing layer of the lab's DigitsCNN, the specific rule that must stay on top)
EXPECTED = {
    "init-mismatch": ("conv1", "SD501"),  # other weights: the very first layer already parts
    "mode-mismatch": ("bn1", "SD502"),  # eval mode: conv1 agrees, BatchNorm reads running statistics
}
# The detection matrix's own runs (both faults start at step 1), started ahead (tests/conftest.py).
LAB_RUNS = [{"fault": fault} for fault in [*EXPECTED, "clean"]]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [*EXPECTED, "clean"])
def test_lab_canary_names_the_first_differing_layer(lab, fault: str) -> None:
    diag = diagnose([lab(fault).out])
    canary = [f for f in diag.findings if f.code == "SD504"]
    if fault == "clean":
        assert not canary, [f.title for f in diag.findings]
        return
    layer, specific = EXPECTED[fault]
    assert canary and canary[0].tensor == layer and canary[0].step == 1
    assert diag.findings[0].code == specific  # the canary supports the specific cause, never pushes it off

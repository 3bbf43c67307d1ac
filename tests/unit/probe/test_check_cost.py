"""The check step's shortcuts (issue #27) give what the long way gives: the cached
hyperparameter fingerprint, the walk that looks for gradients outside DDP's reducer,
the inline view cache of the fingerprints, and the modules a rank does not import."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from syncdoctor.probe.core.compare import groups_fingerprint
from syncdoctor.probe.torch.fingerprint import ViewCache, fingerprints
from syncdoctor.probe.torch.probe import Probe, _grad_outside


def _probe(tmp_path: Path) -> tuple[Probe, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    probe = Probe(model, opt, run_dir=tmp_path, canary=False)
    return probe, opt


@pytest.mark.parametrize(
    "values",
    [
        [0.1, 0.2, 0.2, 0.1],
        [0.0, -0.0, 0.0],  # equal, but printed apart
        [1, 1.0, True, 1],  # equal, of other classes
        [math.nan, math.nan, 0.5],
        ["a", "", "''"],
    ],
)
def test_the_cached_hyperparameter_fingerprint_follows_every_change(tmp_path: Path, values: list[object]) -> None:
    probe, opt = _probe(tmp_path)
    try:
        for value in values:
            opt.param_groups[0]["lr"] = value
            opt.param_groups[0]["note"] = value
            assert probe._hparams_fp() == groups_fingerprint(probe._group_hparams()), value
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))], "lr": 0.3})
        assert probe._hparams_fp() == groups_fingerprint(probe._group_hparams())
    finally:
        probe.close()


def test_the_walk_finds_a_gradient_outside_the_reducer_where_named_parameters_does() -> None:
    inner = nn.Linear(2, 2)
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(inner, inner), nn.Identity())
    model.register_module("nothing", None)
    reduced = {id(p) for p in model.parameters()}
    assert not _grad_outside(model, reduced)
    inner.bias.grad = torch.zeros(2)
    assert not _grad_outside(model, reduced)  # reduced: not outside
    reduced.discard(id(inner.bias))
    assert _grad_outside(model, reduced)
    inner.bias.grad = None
    assert not _grad_outside(model, reduced)  # no gradient: nothing to say


def test_cached_views_follow_a_parameter_whose_storage_moved() -> None:
    p = nn.Parameter(torch.arange(8.0))
    cache = ViewCache()
    first = fingerprints([p], cache=cache, kind="param")
    with torch.no_grad():
        p.add_(1.0)
    assert fingerprints([p], cache=cache, kind="param") == fingerprints([p]) != first
    p.data = torch.arange(4.0)  # the same object, other memory
    assert fingerprints([p], cache=cache, kind="param") == fingerprints([p])
    grad = torch.ones(4)
    assert fingerprints([None, grad], cache=cache, kind="grad") == [0, *fingerprints([grad])]


def test_a_rank_does_not_import_the_heal_or_the_doctors_compare_at_start_up() -> None:
    code = (
        "import sys, torch; import syncdoctor.probe.torch.attach, syncdoctor.probe.torch.check; "
        "print(sorted(m for m in sys.modules if m in "
        "('syncdoctor.probe.torch.heal', 'syncdoctor.records.compare')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"

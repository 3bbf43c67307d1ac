"""The live bindings at checks (probe field params_rebound, docs/records.md): the
module's parameters that are not the watched objects, and the watched ones given new
storage. Single processes here; the two-rank twin (ddp_train.py --rebind-at) is in
tests/e2e/probe/test_round_trip.py and tests/rules/SD509."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import syncdoctor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _train(run_dir: Path, after_step: Callable[[int, nn.Module], Any] | None = None, wrap: Any = None) -> list[dict]:
    """Eight steps with a check at every step; `after_step(step, net)` runs after each update."""
    torch.manual_seed(0)
    net = Net()
    model = wrap(net) if wrap is not None else net
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = syncdoctor.attach(model, opt, run_dir=run_dir, check_every=1, canary=False)
    for step in range(1, 9):
        x, y = torch.randn(4, 6), torch.randint(0, 3, (4,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        probe.loss(loss)
        opt.step()
        if after_step is not None:
            after_step(step, net)
    probe.close()
    lines = (run_dir / "records" / "rank0.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == "step" and "param_fp" in r]


def _rebound(checks: list[dict]) -> dict[int, tuple[int | None, str | None]]:
    return {r["step"]: (r.get("params_rebound"), r.get("params_rebound_first")) for r in checks}


def test_a_storage_swap_through_data_is_counted_from_the_next_check(tmp_path: Path) -> None:
    """What torch.nn.utils.prune.remove does to the live model: `p.data = new tensor`.
    The parameter is the same object, its version counter unchanged; its storage is new."""

    def swap(step: int, net: nn.Module) -> None:
        if step == 3:
            net.fc2.weight.data = net.fc2.weight.detach() * 1.0

    seen = _rebound(_train(tmp_path, swap))
    assert all(seen[s] == (None, None) for s in (1, 2, 3)), seen
    assert all(seen[s] == (1, "fc2.weight") for s in range(4, 9)), seen


def test_prune_remove_on_the_training_model_is_counted(tmp_path: Path) -> None:
    def export(step: int, net: nn.Module) -> None:
        if step == 4:
            prune.l1_unstructured(net.fc1, "weight", amount=0.5)
            prune.remove(net.fc1, "weight")

    seen = _rebound(_train(tmp_path, export))
    assert seen[4] == (None, None) and seen[5] == (1, "fc1.weight"), seen


def test_a_parameter_assigned_after_the_probe_began_is_counted_while_it_is_there(tmp_path: Path) -> None:
    def assign(step: int, net: nn.Module) -> None:
        if step == 2:
            net.fc1.bias = nn.Parameter(net.fc1.bias.detach().clone())

    seen = _rebound(_train(tmp_path, assign))
    assert seen[2] == (None, None) and seen[3] == (1, "fc1.bias") and seen[8] == (1, "fc1.bias"), seen


def test_a_layer_replaced_after_the_probe_began_counts_its_new_parameters(tmp_path: Path) -> None:
    def replace(step: int, net: nn.Module) -> None:
        if step == 5:
            net.fc1 = nn.Linear(6, 8)

    seen = _rebound(_train(tmp_path, replace))
    assert seen[5] == (None, None) and seen[6] == (2, "fc1.weight"), seen


# Without DDP the probe's forward watch of a measured step is torch's global module hook,
# which torch.compile warns about (every step is measured at check_every=1): not this test's subject.
@pytest.mark.filterwarnings("ignore:Using `torch.compile\\(module\\)` when there are global hooks")
def test_healthy_training_renames_moves_and_wrappers_record_nothing(tmp_path: Path) -> None:
    """The update writes in place; a pruning left in place renames weight to weight_orig
    (the same object), as a new container around a layer renames its parameters;
    model.to() on its own device and a compiled wrapper keep the objects."""

    def rename_and_move(step: int, net: nn.Module) -> None:
        if step == 3:
            prune.l1_unstructured(net.fc2, "weight", amount=0.25)
        if step == 5:  # a new container around the same layer: the same parameters
            net.fc1 = nn.Sequential(net.fc1)
        net.to("cpu")

    for name, after, wrap in [
        ("plain", None, None),
        ("renamed", rename_and_move, None),
        ("compiled", None, lambda net: torch.compile(net, backend="eager")),
    ]:
        checks = _train(tmp_path / name, after, wrap)
        assert len(checks) >= 8, name
        assert not any("params_rebound" in r or "params_rebound_first" in r for r in checks), (name, checks)

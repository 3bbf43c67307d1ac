"""The canary forward (probe/torch/canary.py) and the rule that reads it (SD504): single
processes here; the multi-rank lab runs are in tests/e2e/lab/test_canary_lab.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from torch import nn

import syncdoctor
from syncdoctor.doctor.diagnose import diagnose
from syncdoctor.probe.torch.canary import Canary
from syncdoctor.records import read_run

FIXTURES = Path(__file__).resolve().parents[2] / "rules" / "SD504"


class SmallNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.act = nn.ReLU(inplace=True)  # changes the conv/bn output in place: read before it
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc(self.drop(self.act(self.bn(self.conv(x))).flatten(1))) * scale


def _train(run_dir: Path, canary: bool, steps: int = 8) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    probe = syncdoctor.attach(model, opt, run_dir=run_dir, check_every=1, canary=canary)
    probe.detail_every = 2  # type: ignore[union-attr]  # a canary every other step, not every 100th
    losses = []
    for _ in range(steps):
        x, y = torch.randn(5, 1, 6, 6), torch.randint(0, 3, (5,))  # the training RNG: must be untouched
        loss = nn.functional.cross_entropy(model(x, scale=1.0), y)
        opt.zero_grad()
        loss.backward()
        probe.loss(loss)
        opt.step()
        losses.append(loss.item())
    probe.close()
    return losses, [t.detach().clone() for t in [*model.parameters(), *model.buffers()]]


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "records" / "rank0.jsonl").read_text().splitlines()]


def test_training_is_bitwise_the_same_with_the_canary_on_and_off(tmp_path: Path) -> None:
    losses_on, state_on = _train(tmp_path / "on", canary=True)
    losses_off, state_off = _train(tmp_path / "off", canary=False)
    assert losses_on == losses_off
    assert all(torch.equal(a, b) for a, b in zip(state_on, state_off, strict=True))
    with_canary = [r for r in _steps(tmp_path / "on") if r.get("canary")]
    assert [r["step"] for r in with_canary] == [1, 2, 4, 6, 8]  # the detailed steps: step 1 and every 2nd
    canaries = [r["canary"] for r in with_canary]
    assert canaries[0]["layers"] == ["conv", "bn", "act", "drop", "fc", "SmallNet"]
    assert canaries[0]["sig"] == "2x1x6x6:float32"
    assert not any(r.get("canary") for r in _steps(tmp_path / "off"))
    assert read_run(tmp_path / "on").steps["canary"].drop_nulls().len() == 5  # the reader's schema holds it


def test_same_state_same_fingerprints_and_a_mode_difference_parts_at_the_batchnorm() -> None:
    runs = []
    for eval_mode in (False, False, True):
        torch.manual_seed(0)
        model = SmallNet()
        model.train(not eval_mode)
        canary = Canary(model)
        canary.build((torch.randn(7, 1, 6, 6),), {"scale": 2.0})
        runs.append(canary.run())
    assert runs[0] == runs[1]
    first_differing = next(i for i, (a, b) in enumerate(zip(runs[0]["fps"], runs[2]["fps"], strict=True)) if a != b)
    assert runs[0]["layers"][first_differing] == "bn"


def test_an_input_the_canary_cannot_rebuild_makes_no_canary() -> None:
    class Batch:  # a framework's batch object: it may hold this rank's real data
        def __init__(self, x: torch.Tensor) -> None:
            self.x = x

    canary = Canary(nn.Linear(2, 2))
    canary.build((Batch(torch.ones(3, 2)),), {})
    assert not canary.ready and canary.error and "Batch" in canary.error


def test_a_canary_that_cannot_run_is_switched_off_with_one_event_and_training_goes_on(tmp_path: Path) -> None:
    class NeedsBigBatch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.view(8, 4))  # fails on the canary's batch of 2

    model = NeedsBigBatch()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = syncdoctor.attach(model, opt, run_dir=tmp_path, check_every=1)
    probe.detail_every = 2  # type: ignore[union-attr]
    for _ in range(5):
        loss = model(torch.randn(8, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        probe.loss(loss)
        opt.step()
    probe.close()
    records = _steps(tmp_path)
    off = [r for r in records if r["kind"] == "event" and r["event"] == "canary_off"]
    assert len(off) == 1 and "RuntimeError" in off[0]["message"]
    assert not probe.disabled  # type: ignore[union-attr]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3, 4, 5]


def _three_ranks(tmp_path: Path, odd_rank_high: bool) -> Path:
    """Records of three ranks whose canary agrees at every check; the real batches'
    first-block activations have rank 2 always highest (data differs) or in no order."""
    snapshot = json.loads((FIXTURES / "silent" / "records" / "rank0.jsonl").read_text().splitlines()[0])
    rng = random.Random(0)
    canary = {
        "sig": "2x1x8x8:float32",
        "layers": ["conv1", "fc"],
        "fps": [11, 22],
        "mean": [0.1, 0.2],
        "std": [1.0, 1.0],
    }
    for rank in range(3):
        lines = [json.dumps({**snapshot, "rank": rank, "world_size": 3})]
        for step in range(1, 13):
            mean = rng.gauss(0.0, 1.0) + (5.0 if odd_rank_high and rank == 2 else 0.0)
            record = {"v": 1, "kind": "step", "rank": rank, "step": step, "micro": 1, "backward": step}
            record |= {"opt_steps": step, "t": 1.0 + step, "loss": 1.0 / step, "lr": 0.1}
            record["acts"] = [{"name": "0:Conv2d", "mean": mean, "std": 1.0}]
            if step in (1, 11):
                record["canary"] = canary
            lines.append(json.dumps(record))
        (tmp_path / "records").mkdir(parents=True, exist_ok=True)
        (tmp_path / "records" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_canary_agreeing_while_one_ranks_activations_sit_apart_is_the_data(tmp_path: Path) -> None:
    fire = diagnose([_three_ranks(tmp_path / "fire", odd_rank_high=True)])
    found = [f for f in fire.findings if f.code == "SD504"]
    assert found and found[0].ranks == [2] and "data" in found[0].title
    silent = diagnose([_three_ranks(tmp_path / "silent", odd_rank_high=False)])
    assert not [f for f in silent.findings if f.code == "SD504"]


def test_the_lab_fixtures_name_the_first_differing_layer() -> None:
    layers = {}
    for case in ("fire", "fire_mode"):
        found = [f for f in diagnose([FIXTURES / case]).findings if f.code == "SD504"]
        layers[case] = found[0].tensor
    assert layers == {"fire": "conv1", "fire_mode": "bn1"}

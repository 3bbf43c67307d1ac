"""The canary forward's own cost (probe/torch/canary.py), one process, no process group: the
thread CPU time of one canary call against one training step of the same model, and
what that is per step at the default interval (one canary per detailed check, every
`detail_every` steps). A quick complement to bench_probe.py, whose two-rank CNN run
takes long on a busy machine.

    python benchmarks/bench_canary.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import ResNetSmall, mlp  # noqa: E402

from syncdoctor.probe.torch import probe as core  # noqa: E402
from syncdoctor.probe.torch.canary import Canary  # noqa: E402

DETAIL_EVERY = core.DEFAULT_CHECK_EVERY * -(-core.DETAIL_EVERY // core.DEFAULT_CHECK_EVERY)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def main() -> None:
    torch.set_num_threads(1)
    cases = (
        ("cnn", ResNetSmall(), torch.randn(16, 3, 32, 32), 10),
        ("mlp", mlp(), torch.randn(64, 256), 200),
    )
    for name, model, x, n in cases:
        y = torch.randint(0, 10, (x.shape[0],))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        for _ in range(3):
            train_step(model, optimizer, x, y)
        t0 = time.thread_time()
        for _ in range(n):
            train_step(model, optimizer, x, y)
        step_s = (time.thread_time() - t0) / n
        canary = Canary(model)
        canary.build((x,), {})
        canary.run()
        calls = 20
        t0 = time.thread_time()
        for _ in range(calls):
            out = canary.run()
        canary_s = (time.thread_time() - t0) / calls
        per_step = canary_s / DETAIL_EVERY
        print(
            f"{name}: step {step_s * 1e3:.2f} ms (thread CPU, batch {x.shape[0]}); canary {canary_s * 1e3:.2f} ms "
            f"per call ({len(out['layers'])} module outputs); every {DETAIL_EVERY} steps: "
            f"{per_step * 1e6:.1f} us per step, {100 * per_step / step_s:.3f}% of a step"
        )


if __name__ == "__main__":
    main()

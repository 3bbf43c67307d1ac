"""The framework integrations import their framework only when used, and unwrap the
optimizers frameworks wrap."""

from __future__ import annotations

import subprocess
import sys

import torch

from syncdoctor.probe.torch.probe import unwrap_optimizer


def test_integrations_import_without_their_frameworks() -> None:
    code = (
        "import sys; import syncdoctor.probe.integrations.lightning, syncdoctor.probe.integrations.huggingface; "
        "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'accelerate') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_wrapped_optimizers_are_unwrapped() -> None:
    inner = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)

    class Wrapper(torch.optim.Optimizer):  # as accelerate's AcceleratedOptimizer holds it
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self.optimizer = optimizer

    class LightningStyle:  # as Lightning's LightningOptimizer holds it
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self._optimizer = optimizer

    assert unwrap_optimizer(inner) is inner
    assert unwrap_optimizer(Wrapper(inner)) is inner
    assert unwrap_optimizer(LightningStyle(Wrapper(inner))) is inner
    assert unwrap_optimizer(None) is None

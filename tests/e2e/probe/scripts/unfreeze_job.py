"""A backbone frozen when DDP wraps the model and unfrozen later (gradual unfreezing,
as fine-tuning recipes do), or, with --head-after-wrap, the classifier head replaced
after the wrap: either way some parameters get gradients DDP's reducer never covers.
With --unfreeze-before-wrap the backbone is unfrozen before DDP is built (healthy).
With --learnable-temperature the loss divides the logits by a learnable temperature that
lives outside the wrapped model, in the optimizer: its gradient is never averaged."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--unfreeze-at", type=int, default=12)
p.add_argument("--unfreeze-before-wrap", action="store_true")
p.add_argument("--learnable-temperature", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
inputs, labels = torch.randn(4096, 16, generator=g), torch.randint(0, 4, (4096,), generator=g)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
backbone = list(model[:4].parameters())
for param in backbone:
    param.requires_grad_(args.unfreeze_before_wrap)
model = DDP(model)
temperature = nn.Parameter(torch.ones(()))
extra = [temperature] if args.learnable_temperature else []
optimizer = torch.optim.SGD([*model.parameters(), *extra], lr=0.05)  # frozen ones get no gradient yet
for step in range(args.steps):
    if step == args.unfreeze_at:
        for param in backbone:
            param.requires_grad_(True)
    batch = slice((step * 2 + rank) * 16, (step * 2 + rank + 1) * 16)
    logits = model(inputs[batch])
    loss = nn.functional.cross_entropy(logits / temperature if extra else logits, labels[batch])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()

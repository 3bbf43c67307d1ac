"""No DDP: a hand-written all_reduce of the gradients, with torch.amp.GradScaler.
At step 3 the loss is blown up so the scaler finds inf gradients and skips the step."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=20))
world = dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
loss_fn = nn.MSELoss()
g = torch.Generator().manual_seed(int(os.environ["RANK"]))
for step in range(1, 9):
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    loss = loss_fn(model(x), y) * (1e38 if step == 3 else 1.0)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    scaler.step(optimizer)
    scaler.update()
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale()}", flush=True)
dist.destroy_process_group()

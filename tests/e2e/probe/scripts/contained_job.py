"""A plain DDP job with a GradScaler that every zero-code hook point sees: process
group, DDP construction, forward, backward, the scaler's step, the optimizer's step,
check steps (K=5) and the process group's end. Writes the sha256 of its final parameters to
OUT/final{rank}.sha256 and exits 0."""

from __future__ import annotations

import hashlib
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
g = torch.Generator().manual_seed(rank)
for _ in range(12):
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.module.parameters())).hexdigest()
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"final{rank}.sha256"), "w") as fh:
    fh.write(digest + "\n")
dist.destroy_process_group()  # under `syncdoctor run`, this closes the probe first
# torch can abort a process while the interpreter finalizes, after the script is done
# (pytorch/pytorch#190489: "terminate called without an active exception", seen here on
# the plain run): this test is about the exit code the script chooses, so it leaves at once.
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)

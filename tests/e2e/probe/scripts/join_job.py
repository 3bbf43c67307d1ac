"""Uneven inputs handled the way torch documents it: rank 0 has more batches than rank 1,
and training runs under `Join`, so the rank that runs out shadows the other's
all-reduces until both are done. Healthy: the replicas stay equal, only the step
counts differ.

--no-join: the same uneven shards without `Join` (the bug): rank 1 leaves after its
last batch while rank 0 waits in the next update's all-reduce for a partner that is
gone, and fails."""

from __future__ import annotations

import argparse
import contextlib
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=24)
p.add_argument("--no-join", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=15))
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
inputs, labels = torch.randn(4096, 16, generator=g), torch.randint(0, 4, (4096,), generator=g)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
my_steps = args.steps if rank == 0 else args.steps - 4  # rank 1's shard is shorter
with contextlib.nullcontext() if args.no_join else Join([model]):
    for step in range(my_steps):
        batch = slice((step * 2 + rank) * 16, (step * 2 + rank + 1) * 16)
        loss = nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()

"""Train, checkpoint, then rebuild the model, its DDP wrapper and its optimizer in the
same process, load the checkpoint and resume: one replica, two sets of objects. With
--load-on-rank0-only the checkpoint goes into the rebuilt objects on rank 0 only, after
DDP's constructor broadcast the fresh weights (a silent fault). With --resume-after-wrap
there is no first run: every rank makes the same pretrained weights, wraps a fresh
model in DDP, then loads them (on rank 0 only with --load-on-rank0-only: the replicas
differ before their first update although the wrap made them equal)."""

from __future__ import annotations

import argparse
import io

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30, help="steps before and after the rebuild")
p.add_argument("--load-on-rank0-only", action="store_true")
p.add_argument("--resume-after-wrap", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
inputs, labels = torch.randn(4096, 16, generator=g), torch.randint(0, 4, (4096,), generator=g)


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def build() -> tuple[DDP, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DDP(net())
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def train(model: DDP, optimizer: torch.optim.Optimizer, first: int, steps: int) -> None:
    for step in range(first, first + steps):
        batch = slice((step * 2 + rank) * 16, (step * 2 + rank + 1) * 16)
        loss = nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if args.resume_after_wrap:
    torch.manual_seed(1)
    pretrained = net().state_dict()
    model, optimizer = build()
    if rank == 0 or not args.load_on_rank0_only:
        model.module.load_state_dict(pretrained)
    train(model, optimizer, 0, args.steps)
    dist.destroy_process_group()
    raise SystemExit(0)

model, optimizer = build()
train(model, optimizer, 0, args.steps)
checkpoint = io.BytesIO()
torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)
del model, optimizer

model, optimizer = build()
checkpoint.seek(0)
state = torch.load(checkpoint)
if rank == 0 or not args.load_on_rank0_only:
    model.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
train(model, optimizer, args.steps, args.steps)
dist.destroy_process_group()

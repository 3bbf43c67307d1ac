"""Hand-written gradient averaging (no DDP, as MindSpore's DistributedGradReducer or the
torch tutorial do it) and an auxiliary head that a batch uses only when it holds enough
samples of the rare class, so some ranks skip it at some steps. The average reduces a
zero stand-in for a gradient a rank did not produce and drops it: those ranks keep no
gradient there and do not update the head. With --write-back the reduced tensor is
assigned to `p.grad` on every rank (healthy). --noise-after-average adds "gradient
noise" to the averaged gradients from a generator seeded per rank (the all-reduce is
right; what comes after it differs per rank). --unreduced-every N adds, after every N-th
update, a second phase in the shape of StyleGAN2's lazy regularisation: the backward of a
penalty and an optimizer step with no average at all, so that update reads each rank's own
gradient of its own batch."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--write-back", action="store_true")
p.add_argument("--noise-after-average", action="store_true")
p.add_argument("--unreduced-every", type=int, default=0)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
noise = torch.Generator().manual_seed(100 + rank)
inputs, labels = torch.randn(4096, 16, generator=g), torch.randint(0, 6, (4096,), generator=g)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.head = nn.Linear(32, 6)
        self.rare_head = nn.Linear(32, 2)  # "is it class 0?", trained on batches rich in it


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def average_gradients() -> None:
    for param in model.parameters():
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        dist.all_reduce(grad)
        grad /= world
        if args.write_back:
            param.grad = grad
        if args.noise_after_average:
            grad.add_(torch.randn(grad.shape, generator=noise) * 0.1)


for step in range(args.steps):
    batch = slice((step * world + rank) * 16, (step * world + rank + 1) * 16)
    x, y = inputs[batch], labels[batch]
    h = model.body(x)
    loss = F.cross_entropy(model.head(h), y)
    if int((y == 0).sum()) >= 4:
        loss = loss + F.cross_entropy(model.rare_head(h), (y == 0).long())
    optimizer.zero_grad()
    loss.backward()
    average_gradients()
    optimizer.step()
    if args.unreduced_every and step % args.unreduced_every == args.unreduced_every - 1:
        optimizer.zero_grad()
        penalty = model.head(model.body(x)).square().mean() * 0.1
        penalty.backward()
        optimizer.step()  # the bug: no average_gradients() in this phase
dist.destroy_process_group()

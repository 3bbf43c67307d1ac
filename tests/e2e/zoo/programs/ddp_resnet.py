"""A hand-written DDP script in the style of the PyTorch ImageNet example: a small
ResNet (basic blocks, BatchNorm) written here, `DistributedSampler` with `set_epoch`,
SGD with momentum, started with `python -m torch.distributed.run --nproc-per-node 2`.

--bug switches on one silent mistake DDP users report:
  no_sampler         the loader has no DistributedSampler (`shuffle=True` with every rank
                     seeded alike): each rank trains on the same batches.
                     https://github.com/EleutherAI/oslo/issues/59
  no_broadcast_bn    `DistributedDataParallel(model, broadcast_buffers=False)` without
                     SyncBatchNorm: each rank keeps its own BatchNorm statistics.
                     https://github.com/open-mmlab/mmdetection/issues/2539,
                     https://github.com/pytorch/pytorch/issues/13711
  eval_rank0         rank 0 evaluates mid-epoch (`model.eval()`) and the loop never calls
                     `model.train()` again: rank 0 trains without dropout and with frozen
                     BatchNorm statistics from then on.
                     https://github.com/shubhamagarwal92/mmd/issues/14
--syncdoctor DIR     `syncdoctor.attach(model, optimizer, run_dir=DIR)` after the DDP wrap.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from user_ops import record, user_moment
from zoo_data import digits_images, save_final

EVAL_AFTER = 7  # eval_rank0: rank 0 evaluates after this step


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer2(self.layer1(self.stem(x)))
        return self.fc(self.dropout(F.adaptive_avg_pool2d(out, 1).flatten(1)))


def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
            if i == 1:
                break
    return correct / max(total, 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bug", default="")
    p.add_argument("--syncdoctor", metavar="DIR")
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--final-dir")
    p.add_argument("--ops-dir", help="run user_ops at three moments, outcomes here")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)

    dataset = digits_images()
    if args.bug == "no_sampler":
        sampler = None
        loader = DataLoader(dataset, batch_size=32, shuffle=True, drop_last=True)
    else:
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
    val_loader = DataLoader(dataset, batch_size=64)

    model = DDP(SmallResNet(), broadcast_buffers=args.bug != "no_broadcast_bn")
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    probe = None
    if args.syncdoctor:
        import syncdoctor

        probe = syncdoctor.attach(
            model, optimizer, run_dir=args.syncdoctor, check_every=args.check_every, loss_fn=criterion, loader=loader
        )
    example = torch.stack([dataset[i][0] for i in range(2)])
    record(args.ops_dir, rank, "built", model.module, model, optimizer, example)

    step, epoch = 0, 0
    model.train()
    while step < args.steps:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if probe is not None:
                probe.loss(loss)
            optimizer.step()
            step += 1
            if moment := user_moment(step, args.check_every):
                record(args.ops_dir, rank, moment, model.module, model, optimizer, example)
            if rank == 0:
                print(f"Epoch: [{epoch}][{step}] Loss {loss.item():.4f}", flush=True)
            if args.bug == "eval_rank0" and rank == 0 and step == EVAL_AFTER:
                print(f" * Acc@1 {validate(model.module, val_loader):.3f}", flush=True)
            if step >= args.steps:
                break
        epoch += 1
    if probe is not None:
        probe.close()
    save_final(args.final_dir, rank, model.module.state_dict())
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

"""A hand-written data-parallel loop without DDP: the gradients are averaged with
`dist.all_reduce` after backward, as tutorials on writing distributed training from
scratch do. Started with `python -m torch.distributed.run --nproc-per-node 2`.

--bug switches on one silent mistake people make writing this loop:
  sum_grads     all_reduce SUM without dividing by the world size: the update is
                world_size times too large.
                https://github.com/spellml/deeplab-voc-2012/issues/3
  rank_seed     `torch.manual_seed(seed + rank)` before building the model (safe under
                DDP, whose constructor broadcasts rank 0's weights; here nothing does):
                the replicas start from different weights and stay different.
                https://github.com/karpathy/nanoGPT/issues/22, https://github.com/bl0/moco/issues/4
  skip_spike    a loss-spike guard that skips `optimizer.step()` when this rank's own
                loss rose by more than 1% since its last step: each rank decides alone,
                one rank skips an update the other takes, and the replicas part.
                https://github.com/huggingface/accelerate/issues/94 (every process must
                take the same update)
--syncdoctor DIR  `syncdoctor.attach(model, optimizer, run_dir=DIR)` after building them.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from user_ops import record, user_moment
from zoo_data import digits_images, save_final

SPIKE = 1.01  # skip_spike: skip the update when the loss rose by more than this factor


def average_gradients(model: nn.Module, world_size: int, divide: bool) -> None:
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            if divide:
                param.grad /= world_size


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
    torch.manual_seed(args.seed + (rank if args.bug == "rank_seed" else 0))

    dataset = digits_images()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    probe = None
    if args.syncdoctor:
        import syncdoctor

        probe = syncdoctor.attach(
            model, optimizer, run_dir=args.syncdoctor, check_every=args.check_every, loader=loader
        )
    example = torch.stack([dataset[i][0] for i in range(2)])
    record(args.ops_dir, rank, "built", model, None, optimizer, example)

    step, epoch, previous = 0, 0, float("inf")
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if probe is not None:
                probe.loss(loss)
            average_gradients(model, world_size, divide=args.bug != "sum_grads")
            step += 1
            spike = step > 5 and loss.item() > SPIKE * previous
            previous = loss.item()
            if args.bug == "skip_spike" and spike:
                print(f"rank {rank} step {step}: loss spike {loss.item():.3f}, update skipped", flush=True)
            else:
                optimizer.step()
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
            if moment := user_moment(step, args.check_every):
                record(args.ops_dir, rank, moment, model, None, optimizer, example)
            if step >= args.steps:
                break
        epoch += 1
    if probe is not None:
        probe.close()
    save_final(args.final_dir, rank, model.state_dict())
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

"""A small FSDP2 classifier on the digits set, as the torch docs write it: an MLP whose
blocks and root are `fully_shard`ed over a 1-D mesh of every rank (each rank holds half
of every parameter, the optimizer steps the shards), started with
`python -m torch.distributed.run --nproc-per-node 2`.

Healthy only: it is here so the probe's promises (no change to training, invisible to
the user's objects) are kept on sharded parameters too.
--syncdoctor DIR attaches the probe in one line after the optimizer is built.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from user_ops import record, user_moment
from zoo_data import digits_images, save_final


def build_model() -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--syncdoctor", metavar="DIR")
    p.add_argument("--check-every", type=int, default=5)
    p.add_argument("--final-dir")
    p.add_argument("--ops-dir", help="run user_ops at three moments, outcomes here")
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world_size,))
    model = build_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = digits_images()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, drop_last=True)
    probe = None
    if args.syncdoctor:
        import syncdoctor

        probe = syncdoctor.attach(model, optimizer, run_dir=args.syncdoctor, check_every=args.check_every)
    example = torch.stack([dataset[i][0] for i in range(2)])
    record(args.ops_dir, rank, "built", model, None, optimizer, example)

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            if probe is not None:
                probe.loss(loss)
            optimizer.step()
            step += 1
            print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
            if moment := user_moment(step, args.check_every):
                record(args.ops_dir, rank, moment, model, None, optimizer, example)
            if step >= args.steps:
                break
        epoch += 1
    if probe is not None:
        probe.close()
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    save_final(args.final_dir, rank, state)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()

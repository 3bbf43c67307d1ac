"""One rank of a mesh lab run: a small MLP on the digits set, on 4 processes laid out
as a 2x2 device mesh, in one of two styles of sharded data parallelism:

- hsdp: FSDP2 `fully_shard` on a ("replicate", "shard") mesh. Ranks 0/2 and 1/3 hold
  the same shards; every rank reads its own quarter of the data.
- tp: tensor parallelism on the "tp" dimension (fc1 column-, fc2 row-parallel, the
  LayerNorm in a sequence-parallel region where each tp rank normalises its own
  rows, as Megatron does), FSDP2 over "dp". Ranks 0/1 and 2/3 read the same batches;
  the LayerNorm weights are replicas across tp whose gradients must be summed over tp.

It has no syncdoctor code: the lab runs it under `syncdoctor run -- torchrun`, as a
user would. A fault is one switch (`--fault`), applied from `--onset` where it can be.

    torchrun --nproc-per-node 4 -m syncdoctor.lab.train_mesh --style hsdp --fault none
"""

from __future__ import annotations

import argparse
import os
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from syncdoctor.lab.digits import load_digits_arrays

FAULTS = {
    "none": "healthy",
    "init-mismatch": "every rank seeds the model with its own seed (FSDP2 broadcasts nothing)",
    "replica-data": "replica group 1 reads the data shards of replica group 0 (hsdp)",
    "lr-mismatch": "rank 3 builds its optimizer with twice the learning rate",
    "mode-mismatch": "rank 1 trains in eval mode (dropout off)",
    "sp-norm-unreduced": "the sequence-parallel LayerNorm gradients are not summed over tp (tp)",
    "mp-mismatch": "rank 1 reduces gradients in bfloat16, the others in float32 (hsdp)",
}

p = argparse.ArgumentParser()
p.add_argument("--style", choices=("hsdp", "tp"), default="hsdp")
p.add_argument("--fault", choices=sorted(FAULTS), default="none")
p.add_argument("--steps", type=int, default=60)
p.add_argument("--onset", type=int, default=20)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--batch-size", type=int, default=32)
p.add_argument("--pg-timeout", type=float, default=60.0)
args = p.parse_args()
torch.set_num_threads(1)

# -----------------------------------------------------------------------------
# the mesh
dist.init_process_group("gloo", timeout=timedelta(seconds=args.pg_timeout))
rank, world_size = dist.get_rank(), dist.get_world_size()
assert world_size == 4, "the mesh lab runs on 4 processes (a 2x2 mesh)"
names = ("replicate", "shard") if args.style == "hsdp" else ("dp", "tp")
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
coordinate = mesh.get_coordinate()
assert coordinate is not None  # None only for a rank outside the mesh
row, col = coordinate
if args.style == "hsdp":
    data_shard, n_data_shards = row * 2 + col, 4  # every rank reads its own quarter
    if args.fault == "replica-data":
        data_shard = col  # replica group 1 reads what group 0 reads
else:
    data_shard, n_data_shards = row, 2  # tp peers read the same batches
    tp_group, tp_rank, tp_size = mesh.get_group("tp"), col, 2

# -----------------------------------------------------------------------------
# data: the digits set scikit-learn ships, 64 features per image
digit_images, digit_labels = load_digits_arrays()  # scikit-learn's file, without importing it
features = torch.tensor(digit_images.reshape(len(digit_labels), 64) / 16.0, dtype=torch.float32)
labels = torch.tensor(digit_labels, dtype=torch.long)
train_ids = np.random.default_rng(12345).permutation(len(labels))[360:]


def batches_of_epoch(epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng(args.seed + epoch).permutation(train_ids)  # one order for all
    mine = order[data_shard::n_data_shards]
    return [mine[i : i + args.batch_size] for i in range(0, len(mine) - args.batch_size + 1, args.batch_size)]


# -----------------------------------------------------------------------------
# the sequence-parallel region (tp style): each tp rank normalises its own rows
def all_gather_rows(x: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(tp_size)]
    dist.all_gather(parts, x.contiguous(), group=tp_group)
    return torch.cat(parts)


class ScatterRows(torch.autograd.Function):
    """Forward: keep this rank's rows. Backward: every rank's row gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.chunk(tp_size)[tp_rank].contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return all_gather_rows(grad)


class GatherRows(torch.autograd.Function):
    """Forward: every rank's rows. Backward: this rank's rows of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return all_gather_rows(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.chunk(tp_size)[tp_rank].contiguous()


# -----------------------------------------------------------------------------
# model
class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.norm = nn.LayerNorm(64)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(F.relu(self.fc1(x)))
        h = GatherRows.apply(self.norm(ScatterRows.apply(h))) if args.style == "tp" else self.norm(h)
        return self.head(self.drop(F.relu(h)))


torch.manual_seed(args.seed + (rank if args.fault == "init-mismatch" else 0))
model = MLP()
if args.style == "tp":
    parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
else:
    reduce_dtype = torch.bfloat16 if args.fault == "mp-mismatch" and rank == 1 else torch.float32
    policy = MixedPrecisionPolicy(reduce_dtype=reduce_dtype)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # 2-D mesh: replicate over dim 0, shard over dim 1 (HSDP)
lr = 1e-2 * (2 if args.fault == "lr-mismatch" and rank == 3 else 1)
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
# Dropout masks differ per data shard, as on real jobs; tensor-parallel peers compute one
# replicated activation and must draw the same mask (Megatron's model-parallel RNG tracker).
torch.manual_seed(args.seed + 1000 * data_shard)
print(f"rank {rank} mesh {names} coordinate ({row}, {col}) data shard {data_shard}/{n_data_shards}", flush=True)

# -----------------------------------------------------------------------------
# training
step, epoch = 0, 0
while step < args.steps:
    for ids in batches_of_epoch(epoch):
        step += 1
        model.train(not (args.fault == "mode-mismatch" and rank == 1 and step >= args.onset))
        loss = F.cross_entropy(model(features[ids]), labels[ids])
        optimizer.zero_grad()
        loss.backward()
        if args.style == "tp" and not (args.fault == "sp-norm-unreduced" and step >= args.onset):
            for param in model.norm.parameters():  # replicas across tp: sum the rows' contributions
                dist.all_reduce(param.grad.to_local(), group=tp_group)  # type: ignore[union-attr]  # a DTensor, set by backward
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
        if step >= args.steps:
            break
    epoch += 1
dist.destroy_process_group()
print(f"rank {rank} done pid {os.getpid()}", flush=True)

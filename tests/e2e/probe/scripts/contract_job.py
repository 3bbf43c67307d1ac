"""A short 2-rank gloo job that makes the torch probe write every field it can
without a mesh or a heal (tests/unit/test_record_contract.py): sample ids, a loss scale, a
skipped update, a NaN loss, activation statistics, a baseline, a sampler, and on rank
1 a parameter nudged after step 4 (a mismatch). Usage: contract_job.py RUN_DIR."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import syncdoctor

STEPS = 8


def main(run_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = TensorDataset(torch.arange(64), torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, seed=1))
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    probe = syncdoctor.attach(
        model,
        optimizer,
        run_dir=run_dir,
        loss_fn=loss_fn,
        loader=loader,
        check_every=2,
        activations_every=2,
        baseline={"lr": 0.1, "batch_size": 4},
        global_batch=8,
    )
    for step, (ids, x, y) in zip(range(1, STEPS + 1), loader, strict=False):
        probe.batch(ids)
        loss = loss_fn(model(x), y)
        loss.backward()
        probe.loss(float("nan") if step == 3 else loss)
        if step == 5:
            probe.scale(1024.0)
            probe.skipped()  # an AMP overflow: no update this iteration
        else:
            optimizer.step()
        optimizer.zero_grad()
        if step == 4 and rank == 1:
            with torch.no_grad():
                model.module[0].bias[0] += 1e-3  # the replicas part here
    probe.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
    os._exit(0)

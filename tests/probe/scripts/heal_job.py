"""A small data-parallel job for the heal tests: 3 ranks (gloo), a two-layer MLP,
hand-written gradient averaging, the probe with on_mismatch="heal" and K=2.

    python heal_job.py RUN_DIR MODE      (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

MODE "flip": one bit of rank 1's first weight flips before step 6's update.
MODE "slow": the same, and rank 2 is slow in the optimizer step that carries the heal
(longer than SYNCDOCTOR_HEAL_WAIT_S), so the others must give up and all skip it.
Writes RUN_DIR/final{rank}.json: the parameters' bytes as hex, and the steps done.
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import syncdoctor

run_dir, mode = sys.argv[1], sys.argv[2]
STEPS, FLIP_AT = 40, 6
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
probe = syncdoctor.attach(model, optimizer, run_dir=run_dir, check_every=2, on_mismatch="heal")
data = torch.Generator().manual_seed(100 + rank)


def slow_heal_step(opt, args, kwargs):
    healer = probe.checker.healer
    if rank == 2 and healer.plan is not None and probe.step + 1 == healer.plan["step"]:
        time.sleep(healer.wait_s + 2)  # arrives after the others gave up


if mode == "slow":
    optimizer.register_step_pre_hook(slow_heal_step)

for step in range(1, STEPS + 1):
    x = torch.randn(16, 8, generator=data)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    if rank == 1 and step == FLIP_AT:
        with torch.no_grad():
            model[0].weight.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 22)
    optimizer.step()
probe.close()
state = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
with open(os.path.join(run_dir, f"final{rank}.json"), "w") as f:
    json.dump({"params": state.hex(), "steps": STEPS}, f)
dist.destroy_process_group()

"""A small data-parallel job for the heal tests: 3 ranks (gloo), a two-layer MLP,
hand-written gradient averaging, the probe with on_mismatch="heal" and K=2.

    python heal_job.py RUN_DIR MODE      (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

MODE "flip": one bit of rank 1's first weight flips before step 6's update.
MODE "late": the same, and rank 2 is late (longer than the heal's post wait) at the
check that completes the block holding the flip's check, so the ranks cannot decide
there and the heal is planned for a later check.
MODE "slow": as "late", and rank 2 is slow again in the optimizer step that carries the
planned heal (longer than SYNCDOCTOR_HEAL_WAIT_S), so the others must give up and all skip it.
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


late_done = slow_done = False


def late_rank(opt, args, kwargs):
    """Rank 2 is late at the check that posts the flip's block, then (under "slow") at
    the step of the heal planned after it (the plan is in the store by its update)."""
    global late_done, slow_done
    checker = probe.checker
    healer = checker.healer
    step = probe.step + 1
    if not late_done and step >= FLIP_AT and step % 2 == 0 and len(checker.rows) == checker.block - 1:
        late_done = True
        time.sleep(2 * healer.post_wait_s + 1)
        return
    plans = checker.store.add("heal/plans", 0)
    if (
        mode == "slow"
        and late_done
        and not slow_done
        and plans
        and step == json.loads(checker.store.get(f"heal/{plans}"))["step"]
    ):
        slow_done = True
        time.sleep(healer.wait_s + 2)  # arrives after the others gave up


if mode in ("late", "slow") and rank == 2:
    optimizer.register_step_pre_hook(late_rank)

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

"""One rank of a lab run: data-parallel training of a small CNN on the digits set.

Run by the lab runner as `python -m syncdoctor.lab.train_torch PLAN.json` with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Everything a fault changes is a
knob of the RankPlan (lab/plan.py); the script reads it top to bottom. Its stdout is
the human training log (train.log{rank}).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import syncdoctor
from syncdoctor.lab.digits import load_digits_arrays
from syncdoctor.lab.plan import RankPlan

FP16_MAX = 65504.0
OWN_MODEL_SEED = 7919  # init-mismatch: rank r seeds its model with seed + 7919 × (r + 1)

# -----------------------------------------------------------------------------
# configuration
with open(sys.argv[1]) as plan_file:
    plan = RankPlan.from_json(json.load(plan_file))
run_dir = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
rank, world_size = plan.rank, plan.world_size
torch.set_num_threads(1)


def log(msg: str) -> None:
    stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"{stamp} | rank {rank} | {msg}", flush=True)


dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=plan.pg_timeout_s))
log(f"process group ready: world_size={world_size} sync={plan.sync} pid={os.getpid()}")
# Every rank must create every group, in the same order, even the ranks outside it.
if plan.dropped_rank is not None:
    # (On the dropped rank torch gives a non-member marker, never used there: it returns
    # before reducing; torch>=2.14's annotations say so, so the type is the survivors'.)
    survivors = cast(dist.ProcessGroup, dist.new_group([r for r in range(world_size) if r != plan.dropped_rank]))

# -----------------------------------------------------------------------------
# data: the digits set scikit-learn ships; the held-out split is fixed for all ranks
digit_images, digit_labels = load_digits_arrays()  # scikit-learn's file, without importing it (seconds of CPU)
images = torch.tensor(digit_images / 16.0, dtype=torch.float32).unsqueeze(1)  # N×1×8×8
labels = torch.tensor(digit_labels, dtype=torch.long)
split = np.random.default_rng(12345).permutation(len(labels))
test_ids, train_ids = split[:360], split[360:]
train_positions = np.arange(len(train_ids))  # what the sampler shards: places in train_ids


def shard_for_epoch(epoch: int) -> np.ndarray:
    """The training-set positions this rank reads in `epoch`, in order."""
    shard_id = rank if plan.shard_id is None else plan.shard_id
    seed = None if plan.shuffle_seed is None else plan.shuffle_seed + epoch
    rng = np.random.default_rng(seed)  # seed None: fresh OS entropy, different on every rank
    if plan.shard == "none":
        return rng.permutation(train_positions)
    if plan.shard == "hash":
        # File-style sharding: the set comes in files of uneven size, file k goes to rank k % N.
        bounds = np.sort(np.random.default_rng(7).choice(len(train_positions), 11, replace=False))
        files = np.split(train_positions, bounds)
        mine = np.concatenate([f for k, f in enumerate(files) if k % world_size == shard_id])
        return rng.permutation(mine)
    if plan.shuffle_before_shard:
        return rng.permutation(train_positions)[shard_id::world_size]
    per_rank = len(train_positions) // world_size
    return rng.permutation(train_positions[shard_id * per_rank : (shard_id + 1) * per_rank])


class ShardSampler(torch.utils.data.Sampler[int]):
    """This rank's sample ids for an epoch, as the plan shards them (the shard faults
    live in shard_for_epoch). A sampler like DistributedSampler: the script calls
    set_epoch, and `shuffle` says that the order is shuffled."""

    shuffle = True

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        return iter(shard_for_epoch(self.epoch).tolist())


# The training split only (a loader that replaces the sampler must not reach the held-out
# ids); each item is (image, label, sample id): the id lets the probe fingerprint the batch.
train_set = torch.utils.data.TensorDataset(images[train_ids], labels[train_ids], torch.as_tensor(train_ids))
# Its own generator: iterating a loader draws a seed from it, and the global one drives dropout.
loader = torch.utils.data.DataLoader(
    train_set,
    batch_size=plan.batch_size,
    sampler=ShardSampler(),
    drop_last=plan.drop_last,
    generator=torch.Generator().manual_seed(plan.seed),
)


# -----------------------------------------------------------------------------
# model: a small CNN with BatchNorm and dropout, so that train/eval mode matters
class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(self.drop(F.relu(self.fc1(x.flatten(1)))))


class AsymmetricLoss(nn.Module):
    """ASL (Ridnik et al.), one-vs-rest over the classes, as in the playbook §3.5:
    positives -(1-p)^γ+ log p, negatives -p_m^γ- log(1-p_m) with p_m = max(p - m, 0)."""

    def __init__(self, gamma_pos: float = 0.0, gamma_neg: float = 4.0, margin: float = 0.05):
        super().__init__()
        self.gamma_pos, self.gamma_neg, self.margin = gamma_pos, gamma_neg, margin

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y = F.one_hot(target, logits.shape[1]).float()
        p = torch.sigmoid(logits)
        p_m = (p - self.margin).clamp(min=0)
        pos = y * (1 - p) ** self.gamma_pos * torch.log(p.clamp(min=1e-8))
        neg = (1 - y) * p_m**self.gamma_neg * torch.log((1 - p_m).clamp(min=1e-8))
        return -(pos + neg).sum(1).mean()


# An unseeded rank draws its weights from fresh entropy; the lab's init-mismatch draws
# them from a seed of the rank's own instead, so that the fault repeats run after run
# (of 60 unseeded runs, 3 happened to train as well as one clean card).
torch.manual_seed(plan.seed if plan.seed_model else plan.seed + OWN_MODEL_SEED * (rank + 1))
model: nn.Module = DigitsCNN()
raw_model = model
if plan.sync == "ddp":
    model = DDP(model, broadcast_buffers=plan.broadcast_buffers)
loss_fn = AsymmetricLoss(margin=plan.asl_margin)
optimizer = torch.optim.SGD(raw_model.parameters(), lr=plan.lr, momentum=plan.momentum, weight_decay=plan.weight_decay)
torch.manual_seed(plan.seed + 1000 * rank)  # dropout masks differ per rank, as they do in real jobs

# -----------------------------------------------------------------------------
# gradient reduction. DDP reduces by itself; the hand-written mode does what
# MindSpore's DistributedGradReducer does. Faults that change the reduction use the
# same function for both: as a DDP comm hook, or on the flattened gradients.
step = 0  # optimizer steps completed
loss_scale = 2.0**16 if plan.loss_scale != "none" else 1.0  # dynamic loss scale
local_overflow = False


def reduce_flat(flat: torch.Tensor) -> torch.Tensor:
    global local_overflow
    group = None
    members = world_size
    if plan.drop_rank_at is not None and step >= plan.drop_rank_at:
        if rank == plan.dropped_rank:
            return flat  # timed out, retried, and now left out: it keeps its own gradients
        group, members = survivors, world_size - 1
    # As DDP's fp16_compress_hook: the gradients travel and are summed in float16.
    wire = flat.to(torch.float16) if plan.fp16_grads else flat  # above 65504 becomes inf
    if plan.loss_scale == "dynamic_local" and not torch.isfinite(wire).all():
        # The bug: the overflow decision is taken on this rank's local gradients, and
        # the rank sends zeros instead of infs, so the other ranks never learn of it.
        local_overflow = True
        wire.zero_()
    if plan.reduce_op == "mean":
        wire.div_(members)
    dist.all_reduce(wire, group=group)
    if wire is not flat:
        flat.copy_(wire)
    return flat


# No annotations: DDP inspects them and they'd be strings here; mypy reads the type comment.
def comm_hook(state, bucket):  # type: (object, dist.GradBucket) -> torch.futures.Future[torch.Tensor]
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(reduce_flat(bucket.buffer()))
    return fut


custom_reduction = plan.fp16_grads or plan.reduce_op != "mean" or plan.drop_rank_at is not None
if plan.sync == "ddp" and custom_reduction:
    cast(DDP, model).register_comm_hook(None, comm_hook)  # sync == "ddp": model is the DDP wrapper


def allreduce_gradients() -> None:
    # Every parameter has a gradient after backward: the model uses them all.
    grads = cast(list[torch.Tensor], [p.grad for p in raw_model.parameters()])
    flat = torch.cat([g.flatten() for g in grads])
    reduce_flat(flat)
    torch.nn.utils.vector_to_parameters(flat, grads)


# -----------------------------------------------------------------------------
# the probe: one line, records every step and checks the replicas against each other
probe = syncdoctor.attach(
    model,
    optimizer,
    run_dir=run_dir,
    loss_fn=loss_fn,
    loader={
        "type": "lab",
        "shuffle": True,
        "seed": plan.shuffle_seed,
        "drop_last": plan.drop_last,
        "num_replicas": 1 if plan.shard == "none" else world_size,
        "rank": 0 if plan.shard == "none" else (rank if plan.shard_id is None else plan.shard_id),
        "dataset_len": len(train_ids),
        "batch_size": plan.batch_size,
    },
    global_batch=plan.batch_size * world_size * plan.accum_steps,
    baseline={"lr": plan.base_lr, "batch_size": plan.batch_size},  # the single-card recipe
    enabled=plan.extra.get("probe", True),
    check_every=plan.extra.get("check_every"),
    check_timeout_s=plan.pg_timeout_s,
    on_mismatch=plan.extra.get("on_mismatch"),
)


def flip_bit(tensor: torch.Tensor) -> None:
    """Silent data corruption, as a failing chip or memory cell does it: one bit of one
    float32 value flips, on this rank only, and nothing raises. Through `.data`, whose
    version counter is its own: a chip's flip is no write torch could count."""
    bits = tensor.data.view(-1)[plan.bitflip_index : plan.bitflip_index + 1].view(torch.int32)
    bits.bitwise_xor_(1 << plan.bitflip_bit if plan.bitflip_bit < 31 else -(1 << 31))


# -----------------------------------------------------------------------------
# training
def forward_backward(cycle: list[list[torch.Tensor]]) -> float:
    """The micro-steps of one accumulation cycle; returns their mean loss."""
    losses = []
    for i, (x, y, ids) in enumerate(cycle):
        probe.batch(ids)
        last = i == len(cycle) - 1
        # Under DDP the all-reduce runs inside backward: skip it but on the last micro-step.
        sync_ctx = cast(DDP, model).no_sync() if plan.sync == "ddp" and not last else torch.enable_grad()
        with sync_ctx:
            loss = loss_fn(model(x), y)
            probe.loss(loss)
            (loss * loss_scale / len(cycle)).backward()
        losses.append(loss.item())
    if plan.sync == "allreduce":
        allreduce_gradients()
    return float(np.mean(losses))


def update() -> float:
    """Unscale, check for overflow, step the optimizer; returns the gradient norm."""
    global loss_scale, local_overflow
    grads = cast(list[torch.Tensor], [p.grad for p in raw_model.parameters()])  # all set by backward
    if loss_scale != 1.0:
        for g in grads:
            g.div_(loss_scale)
    overflow = local_overflow or not all(torch.isfinite(g).all() for g in grads)
    local_overflow = False
    grad_norm = torch.norm(torch.stack([g.norm() for g in grads])).item()
    probe.scale(loss_scale)
    if plan.loss_scale != "none" and overflow:
        loss_scale /= 2  # dynamic loss scaling: skip this update, lower the scale
        probe.skipped(overflow=True)
    elif plan.skip_step_at == step + 1:
        pass  # the fault: this rank forgets one update
    else:
        flipped = dict(raw_model.named_parameters())[plan.bitflip_tensor]
        if plan.bitflip_now(step + 1, "param"):
            flip_bit(flipped)
        if plan.bitflip_now(step + 1, "grad"):
            flip_bit(cast(torch.Tensor, flipped.grad))  # the reduced gradient, after the all-reduce
        if plan.bitflip_now(step + 1, "opt") and "momentum_buffer" in optimizer.state[flipped]:
            flip_bit(optimizer.state[flipped]["momentum_buffer"])
        optimizer.step()
        if plan.extra_step_at == step + 1:
            optimizer.step()  # the fault: this rank applies the same update twice
        if plan.loss_scale != "none" and (step + 1) % 50 == 0:
            loss_scale *= 2
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


clean_batches = len(train_ids) // world_size // plan.batch_size // plan.accum_steps
epochs = max(1, math.ceil(plan.steps / clean_batches))
log(
    f"training: epochs={epochs} steps_per_epoch~{clean_batches} lr={plan.lr} "
    f"global_batch={plan.batch_size * world_size * plan.accum_steps}"
)
model.train(plan.train_mode)
t0 = time.time()
for epoch in range(1, epochs + 1):
    cast(ShardSampler, loader.sampler).set_epoch(epoch)  # the sampler given to the loader above
    todo = list(loader)
    while True:
        if plan.crash_at == step + 1:
            log("allocating activation buffer")
            torch.empty(1 << 46, dtype=torch.uint8)  # fails like a real out-of-memory
        if plan.stall_at == step + 1:
            log("waiting for data from storage")
            time.sleep(plan.pg_timeout_s + 5)
        if plan.momentum_override_at == step + 1:
            optimizer.param_groups[0]["momentum"] = plan.momentum_override
        if plan.drop_rank_at == step + 1 and rank == plan.dropped_rank:
            log("[WARNING] allreduce timeout after 1800000ms, retry 1/3 succeeded; continuing")
        if plan.extra_update_now(step + 1) and todo:
            forward_backward(todo[:1])
            update()
            todo = todo[1:]

        micro = plan.micro_steps(step + 1)
        cycle, todo = todo[:micro], todo[micro:]
        if len(cycle) < micro:
            break
        loss = forward_backward(cycle)
        lr = optimizer.param_groups[0]["lr"]
        grad_norm = update()
        step += 1
        log(f"epoch {epoch} | step {step} | loss {loss:.6f} | lr {lr:.6f} | grad_norm {grad_norm:.4f}")

# -----------------------------------------------------------------------------
# evaluation on the held-out split, with this rank's own weights and buffers
model.eval()
with torch.no_grad():
    predictions = raw_model(images[test_ids]).argmax(1)
accuracy = (predictions == labels[test_ids]).float().mean().item()
log(f"finished: steps={step} held-out accuracy {accuracy:.4f} time {time.time() - t0:.1f}s")
with open(os.path.join(run_dir, f"result{rank}.json"), "w") as result_file:
    json.dump({"rank": rank, "steps": step, "accuracy": accuracy}, result_file)
probe.close()
dist.destroy_process_group()

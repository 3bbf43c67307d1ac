"""One rank of a MindSpore lab run: data-parallel training of a small MLP on the digits set.

Launched by the lab runner through msrun (lab/mindspore_runner.py):
    msrun --worker_num=N ... train_mindspore.py PLAN_DIR
Each worker reads PLAN_DIR/plan{RANK_ID}.json (RANK_ID comes from msrun). Everything a
fault changes is a knob of the RankPlan (lab/plan.py); the script reads it top to bottom
and mirrors lab/train_torch.py: same data, model, loss and step. The step is written in
one of the three ways MindSpore users write it (plan.extra["style"]):
  functional  value_and_grad + nn.DistributedGradReducer + optimizer(grads) (the default)
  cell        nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)
  model       Model(net, loss, optimizer).train(...)
The probe is not created here: the runner starts msrun the way `syncdoctor run` does,
so it attaches by itself to whichever style this is. The script only adds what no
hook can know (`report`: the sample ids, the unscaled loss, a skipped update).
Its stdout is msrun's worker_N.log, in LossMonitor's format.

What MindSpore does differently (measured, shared/facts.md): no parameter broadcast at
start (only GRAPH mode with parameter_broadcast=True), BatchNorm statistics are never
synchronised, AllReduce on CPU is SUM only.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops
from mindspore.communication import get_group_size, get_rank, init

from syncdoctor.lab.digits import load_digits_arrays
from syncdoctor.lab.plan import RankPlan
from syncdoctor.probe.mindspore.attach import report, skipped

# -----------------------------------------------------------------------------
# configuration
plan_dir = Path(sys.argv[1]).resolve()
plan = RankPlan.from_json(json.loads((plan_dir / f"plan{os.environ.get('RANK_ID', '0')}.json").read_text()))
run_dir = plan_dir.parent
style = plan.extra.get("style", "functional")
graph = plan.extra.get("ms_mode", "pynative") == "graph"

ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()  # msrun's scheduler hands out the ranks; backend mccl on CPU
rank, world_size = get_rank(), get_group_size()
assert rank == plan.rank and world_size == plan.world_size, (rank, world_size, plan.rank, plan.world_size)
ms.set_auto_parallel_context(
    parallel_mode=ms.ParallelMode.DATA_PARALLEL,
    gradients_mean=plan.reduce_op == "mean",  # grad-sum: gradients_mean=False
    # Only GRAPH mode honours this; PyNative ignores it silently (measured).
    parameter_broadcast=bool(plan.extra.get("parameter_broadcast", False)),
)
print(
    f"rank {rank}/{world_size} ready: style={style} mode={'GRAPH' if graph else 'PYNATIVE'} pid={os.getpid()}",
    flush=True,
)

# -----------------------------------------------------------------------------
# seeds: the model must start equal on every rank, MindSpore broadcasts nothing
if plan.seed_model:
    ms.set_seed(plan.seed)  # also seeds numpy and the dataset (measured)

# -----------------------------------------------------------------------------
# model: a small MLP with BatchNorm and dropout, so that set_train matters. (The torch
# lab's CNN costs ≈0.5 s a step in MindSpore on this CPU; this MLP ≈8 ms under ms.jit.)


class DigitsMLP(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(64, 128)
        self.bn1 = nn.BatchNorm1d(128)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(p=0.2)
        self.fc2 = nn.Dense(128, 10)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return self.fc2(self.drop(self.relu(self.bn1(self.fc1(self.flatten(x))))))


class AsymmetricLoss(nn.LossBase):
    """ASL (Ridnik et al.), one-vs-rest over the classes, as in the playbook §3.5:
    positives -(1-p)^γ+ log p, negatives -p_m^γ- log(1-p_m) with p_m = max(p - m, 0)."""

    def __init__(self, gamma_pos: float = 0.0, gamma_neg: float = 4.0, margin: float = 0.05) -> None:
        super().__init__()
        self.gamma_pos, self.gamma_neg, self.margin = gamma_pos, gamma_neg, margin

    def construct(self, logits: ms.Tensor, label: ms.Tensor) -> ms.Tensor:
        y = ops.one_hot(label, 10, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        p = ops.sigmoid(logits)
        p_m = ops.clamp(p - self.margin, min=0.0)
        pos = y * ops.pow(1 - p, self.gamma_pos) * ops.log(ops.clamp(p, min=1e-8))
        neg = (1 - y) * ops.pow(p_m, self.gamma_neg) * ops.log(ops.clamp(1 - p_m, min=1e-8))
        return -(pos + neg).sum(axis=1).mean()


net = DigitsMLP()
loss_fn = AsymmetricLoss(margin=plan.asl_margin)
optimizer = nn.SGD(
    net.trainable_params(), learning_rate=plan.lr, momentum=plan.momentum, weight_decay=plan.weight_decay
)
grad_reducer = nn.DistributedGradReducer(optimizer.parameters)  # mean from gradients_mean

# -----------------------------------------------------------------------------
# data: the digits set scikit-learn ships; the held-out split is fixed for all ranks
digit_images, digit_labels = load_digits_arrays()  # scikit-learn's file, without importing it (seconds of CPU)
images = (digit_images / 16.0).astype(np.float32)[:, None]  # N×1×8×8
labels = digit_labels.astype(np.int32)
split = np.random.default_rng(12345).permutation(len(labels))
test_ids, train_ids = split[:360], split[360:]
shard_id = rank if plan.shard_id is None else plan.shard_id
# After the model on purpose: ds.config.set_seed also seeds parameter init (measured).
if plan.shuffle_seed is not None:
    ds.config.set_seed(plan.shuffle_seed)


def columns(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"image": images[ids], "label": labels[ids], "idx": ids.astype(np.int32)}


if plan.shard == "none":  # every rank reads everything: num_shards forgotten
    dataset = ds.NumpySlicesDataset(columns(train_ids), shuffle=True)
elif plan.shard == "hash":
    # File-style sharding: the set comes in files of uneven size, file k goes to rank k % N.
    bounds = np.sort(np.random.default_rng(7).choice(len(train_ids), 11, replace=False))
    files = np.split(train_ids, bounds)
    mine = np.concatenate([f for k, f in enumerate(files) if k % world_size == shard_id])
    dataset = ds.NumpySlicesDataset(columns(mine), shuffle=True)
elif not plan.shuffle_before_shard:
    # Each rank loads its own contiguous part (file order) and shuffles only that.
    per_rank = len(train_ids) // world_size
    dataset = ds.NumpySlicesDataset(
        columns(train_ids[shard_id * per_rank : (shard_id + 1) * per_rank]), shuffle=False
    ).shuffle(buffer_size=per_rank)
elif plan.shuffle_seed is None:
    # The playbook's MockDataset: a hand-written shuffle with this process's own
    # unseeded RNG, then the shard. (MindSpore's own shuffle is seeded even when nobody
    # seeds it: its default dataset seed is a fixed 5489.)
    order = list(train_ids)
    random.Random().shuffle(order)
    dataset = ds.NumpySlicesDataset(columns(np.asarray(order)), shuffle=False, num_shards=world_size, shard_id=shard_id)
else:  # the healthy pipeline: one global shuffle with the shared seed, then the shard
    dataset = ds.NumpySlicesDataset(columns(train_ids), shuffle=True, num_shards=world_size, shard_id=shard_id)
dataset = dataset.batch(plan.batch_size, drop_remainder=plan.drop_last)

# -----------------------------------------------------------------------------
# one functional step: value_and_grad, accumulation, the reduction, loss scaling, the update
loss_scaler = None
if plan.loss_scale != "none":
    # DynamicLossScaleManager's defaults (2**24, ×2), with a short window so the scale
    # grows back during a lab run. DynamicLossScaleManager in Model is unsupported on CPU.
    loss_scaler = ms.amp.DynamicLossScaler(scale_value=2.0**24, scale_factor=2, scale_window=20)


def forward(x: ms.Tensor, y: ms.Tensor, scale: ms.Tensor) -> ms.Tensor:
    return loss_fn(net(x), y) * scale


class ForwardBackward(nn.Cell):
    """A Cell so that GRAPH mode compiles it, which is where parameter_broadcast acts;
    under PyNative, ms.jit compiles just this part (≈15× faster than op by op here)."""

    def __init__(self) -> None:
        super().__init__()
        self.net, self.loss_fn = net, loss_fn
        self.grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

    @ms.jit
    def construct(self, x: ms.Tensor, y: ms.Tensor, scale: ms.Tensor) -> tuple:
        return self.grad_fn(x, y, scale)


def scale_value() -> float:
    return float(loss_scaler.scale_value.asnumpy()) if loss_scaler is not None else 1.0


def micro_steps(cycle: list[tuple]) -> tuple[float, tuple]:
    """Forward and backward over the micro-batches of one cycle; local, unreduced grads."""
    scale = ms.Tensor(scale_value(), ms.float32)
    losses, accum = [], None
    for image, label, _ in cycle:
        loss, grads = forward_backward(ms.Tensor(image), ms.Tensor(label), scale)
        losses.append(float(loss.asnumpy()) / scale_value())
        accum = grads if accum is None else tuple(a + g for a, g in zip(accum, grads, strict=True))
    assert accum is not None
    return float(np.mean(losses)), tuple(g / len(cycle) for g in accum)


def reduce(grads: tuple) -> tuple[tuple, bool]:
    """The all-reduce; returns the reduced grads and whether this rank saw an overflow."""
    local_overflow = False
    if plan.fp16_grads:
        grads = tuple(g.astype(ms.float16) for g in grads)  # gradients travel in float16
        if plan.loss_scale == "dynamic_local" and not bool(ms.amp.all_finite(grads)):
            # The bug: the overflow decision is taken on this rank's local gradients, and
            # the rank sends zeros instead of infs, so the other ranks never learn of it.
            local_overflow = True
            grads = tuple(ops.zeros_like(g) for g in grads)
    reduced = grad_reducer(grads)
    return tuple(g.astype(ms.float32) for g in reduced), local_overflow


def update(cycle: list[tuple]) -> float:
    """One optimizer step over a cycle of micro-batches; returns the mean loss."""
    for batch in cycle:
        report(ids=batch[2])  # the sample ids, for the probe's overlap and coverage
    loss, grads_local = micro_steps(cycle)
    report(loss=loss)  # the unscaled loss (what the jitted forward returns is scaled)
    grads, local_overflow = reduce(grads_local)
    scale = scale_value()
    if loss_scaler is not None:
        grads = loss_scaler.unscale(grads)
    finite = bool(ms.amp.all_finite(grads)) and not local_overflow
    if loss_scaler is not None:
        loss_scaler.adjust(ms.Tensor(finite))  # halves on overflow, doubles every window
    if loss_scaler is not None and not finite:
        skipped(loss=loss, loss_scale=scale)  # dynamic loss scaling: skip this update
    elif plan.skip_step_at == step + 1:
        pass  # the fault: this rank forgets one update
    else:
        report(overflow=False if plan.fp16_grads else None, loss_scale=scale if loss_scaler else None)
        optimizer(grads)
        if plan.extra_step_at == step + 1:
            optimizer(grads)  # the fault: this rank applies the same update twice
    return loss


# -----------------------------------------------------------------------------
# faults that act at a step, whatever the style
def before_step(next_step: int) -> None:
    if plan.crash_at == next_step:
        print("allocating activation buffer", flush=True)
        ops.zeros((1 << 46,), ms.float32).asnumpy()  # RuntimeError: Allocate memory failed
    if plan.stall_at == next_step:
        print("waiting for data from storage", flush=True)
        time.sleep(2 * plan.pg_timeout_s + 5)
    if plan.momentum_override_at == next_step:
        # ops.assign, not set_data: after the optimizer's first (jit-compiled) call,
        # set_data changes what asnumpy() shows but not what the update uses (measured).
        ops.assign(optimizer.momentum, ms.Tensor(plan.momentum_override, ms.float32))


# -----------------------------------------------------------------------------
# training
clean_batches = len(train_ids) // world_size // plan.batch_size // plan.accum_steps
epochs = max(1, math.ceil(plan.steps / clean_batches))
print(
    f"training: epochs={epochs} steps_per_epoch~{clean_batches} lr={plan.lr} "
    f"global_batch={plan.batch_size * world_size * plan.accum_steps}",
    flush=True,
)
t0 = time.time()
first_epoch_ids: list[int] = []
step = 0  # optimizer steps completed

if style == "model":

    class LabCallback(ms.train.Callback):
        """The faults a Model.train user's callbacks can cause, and LossMonitor's lines."""

        def on_train_begin(self, run_context: Any) -> None:
            net.set_train(plan.train_mode)  # mode-mismatch: a rank-local callback left the net in eval mode

        def on_train_step_begin(self, run_context: Any) -> None:
            before_step(run_context.original_args().cur_step_num)

        def on_train_step_end(self, run_context: Any) -> None:
            cb = run_context.original_args()
            n = cb.batch_num
            print(
                f"epoch: {cb.cur_epoch_num} step: {(cb.cur_step_num - 1) % n + 1}, "
                f"loss is {float(cb.net_outputs.asnumpy()):.4f}",
                flush=True,
            )

    # Model.train feeds every column to the network: the ids stay behind.
    model = ms.train.Model(net, loss_fn=loss_fn, optimizer=optimizer)
    model.train(epochs, dataset.project(["image", "label"]), callbacks=[LabCallback()], dataset_sink_mode=False)
    step = int(optimizer.global_step.asnumpy()[0])

elif style == "cell":
    train_net = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    net.set_train(plan.train_mode)  # mode-mismatch: this rank forgot set_train (dropout off, BN frozen)
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)
    for epoch in range(1, epochs + 1):
        for in_epoch, (image, label, idx) in enumerate(iterator, start=1):
            if epoch == 1:
                first_epoch_ids.extend(int(i) for i in idx)
            before_step(step + 1)
            report(ids=idx)
            loss = train_net(ms.Tensor(image), ms.Tensor(label))
            step += 1
            print(f"epoch: {epoch} step: {in_epoch}, loss is {float(loss.asnumpy()):.4f}", flush=True)

else:
    forward_backward = ForwardBackward()
    net.set_train(plan.train_mode)  # mode-mismatch: this rank forgot set_train (dropout off, BN frozen)
    iterator = dataset.create_tuple_iterator(num_epochs=epochs, output_numpy=True)

    def draw(batches: Iterator[tuple[Any, ...]], n: int) -> list[tuple]:
        """Up to n batches (image, label, idx) of this epoch, drawn as they are needed."""
        out = []
        for batch in batches:
            out.append(batch)
            if len(out) == n:
                break
        if epoch == 1:
            first_epoch_ids.extend(int(i) for b in out for i in b[2])
        return out

    for epoch in range(1, epochs + 1):
        batches = iter(iterator)  # one epoch of this rank's batches
        in_epoch = 0
        while True:
            before_step(step + 1)
            if plan.extra_update_now(step + 1):
                update(draw(batches, 1))  # the fault: one synced micro-step and an update more
            micro = plan.micro_steps(step + 1)
            cycle = draw(batches, micro)
            if len(cycle) < micro:
                break
            loss = update(cycle)
            step += 1
            in_epoch += 1
            print(f"epoch: {epoch} step: {in_epoch}, loss is {loss:.4f}", flush=True)

# -----------------------------------------------------------------------------
# evaluation on the held-out split, with this rank's own weights and BatchNorm statistics
net.set_train(False)
predictions = net(ms.Tensor(images[test_ids])).asnumpy().argmax(1)
accuracy = float((predictions == labels[test_ids]).mean())
print(f"finished: steps={step} held-out accuracy {accuracy:.4f} time {time.time() - t0:.1f}s", flush=True)
(run_dir / f"result{rank}.json").write_text(
    json.dumps({"rank": rank, "steps": step, "accuracy": accuracy, "epoch1_ids": first_epoch_ids})
)

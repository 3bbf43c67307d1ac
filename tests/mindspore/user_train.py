"""A plain MindSpore data-parallel training script, written the ways the MindSpore docs
show, with no syncdoctor line in it: the zero-code tests run it under
`syncdoctor run -- msrun ...`.

STYLE (env): model       Model(net, loss, opt).train(...)
             cell        TrainOneStepCell(WithLossCell(net, loss), opt), PyNative
             cell-graph  the same in GRAPH mode
             functional  value_and_grad + DistributedGradReducer + optimizer(grads), PyNative
             jit         the whole step as one @ms.jit function
SEED=0: no seed at all (replicas start apart); GRAD_MEAN=0: gradients_mean=False;
EVAL_RANK=R: rank R leaves its network in eval mode (set_train(False)).
REDUCER_MEAN=0|1, REDUCER_DEGREE=D (functional, jit): the DistributedGradReducer built
with that mean / degree (unset: from the parallel context, as the docs show it).
REDUCE=ops (functional, jit): a hand-written mean (ops.AllReduce, then / world) instead.
DS_SEED_BY_RANK=1: ds.config.set_seed(100 + rank) right before the dataset is built, and
ms.set_seed(1) again after it (a per-rank data stream "for augmentation", the model
seeded alike): the sharded shuffle then overlaps.
OPS_DIR=DIR: user_ops.py's operations at three moments, their outcomes in DIR.
"""

import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model
from user_ops import record, user_moment

style = os.environ.get("STYLE", "functional")
seeded = os.environ.get("SEED", "1") != "0"
eval_rank = int(os.environ.get("EVAL_RANK", "-1"))

ms.set_context(mode=ms.GRAPH_MODE if style == "cell-graph" else ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
rank, world = get_rank(), get_group_size()
ms.set_auto_parallel_context(
    parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=os.environ.get("GRAD_MEAN", "1") != "0"
)
if seeded:
    ms.set_seed(1)

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype(np.float32)
y = (x[:, :8].sum(1) > x[:, 8:].sum(1)).astype(np.int32)
ds_seed_by_rank = os.environ.get("DS_SEED_BY_RANK") == "1"
if ds_seed_by_rank:
    ds.config.set_seed(100 + rank)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=world, shard_id=rank).batch(
    16, drop_remainder=True
)
if ds_seed_by_rank and seeded:
    ms.set_seed(1)  # the model's init seeded alike again (it also sets the dataset seed: too late for the sampler)

net = nn.SequentialCell(nn.Dense(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(p=0.1), nn.Dense(32, 2))
loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
epochs = 2
check_every = int(os.environ.get("SYNCDOCTOR_CHECK_EVERY", "50"))
# GRAPH mode here trains differently from run to run without any probe (two plain runs:
# different weights at step 9): its parameters are compared by shape, not value.
reproducible = style != "cell-graph"
record(rank, "built", net, optimizer, reproducible)
step = 0


def after_step() -> None:
    global step
    step += 1
    if moment := user_moment(step, check_every):
        record(rank, moment, net, optimizer, reproducible)


if style == "model":

    class LeftInEval(ms.train.Callback):
        """A rank-local callback (an evaluation on one rank) that leaves the net in eval mode."""

        def on_train_begin(self, run_context):
            if rank == eval_rank:
                net.set_train(False)

        def on_train_step_end(self, run_context):
            after_step()

    model = Model(net, loss_fn=loss_fn, optimizer=optimizer)
    model.train(epochs, data, callbacks=[LeftInEval(), LossMonitor()], dataset_sink_mode=False)

elif style in ("cell", "cell-graph"):
    train_net = nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn), optimizer)
    train_net.set_train()
    if rank == eval_rank:
        net.set_train(False)
    for epoch in range(epochs):
        for xb, yb in data.create_tuple_iterator():
            loss = train_net(xb, yb)
            after_step()
        print(f"epoch: {epoch + 1}, loss is {float(loss.asnumpy()):.4f}", flush=True)

else:

    def forward(xb, yb):
        return loss_fn(net(xb), yb)

    grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)
    reducer_args = {}
    if "REDUCER_MEAN" in os.environ:
        reducer_args["mean"] = os.environ["REDUCER_MEAN"] != "0"
    if "REDUCER_DEGREE" in os.environ:
        reducer_args["degree"] = int(os.environ["REDUCER_DEGREE"])
    if os.environ.get("REDUCE") == "ops":  # a hand-written mean: no DistributedGradReducer at all
        allreduce = ms.ops.AllReduce()

        def grad_reducer(grads):
            return tuple(allreduce(g) / world for g in grads)

    else:
        grad_reducer = nn.DistributedGradReducer(optimizer.parameters, **reducer_args)

    def train_step(xb, yb):
        loss, grads = grad_fn(xb, yb)
        grads = grad_reducer(grads)
        optimizer(grads)
        return loss

    if style == "jit":
        train_step = ms.jit(train_step)
    net.set_train(rank != eval_rank)
    for epoch in range(epochs):
        for xb, yb in data.create_tuple_iterator():
            loss = train_step(xb, yb)
            after_step()
        print(f"epoch: {epoch + 1}, loss is {float(loss.asnumpy()):.4f}", flush=True)

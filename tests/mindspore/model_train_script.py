"""A plain MindSpore Model.train data-parallel script with no syncdoctor line in it:
the auto-attach test runs it under msrun with syncdoctor's sitecustomize on PYTHONPATH."""

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model

ms.set_context(mode=ms.PYNATIVE_MODE)
ms.set_device("CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
ms.set_seed(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x.sum(1) > 0).astype(np.int32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True, num_shards=get_group_size(),
                             shard_id=get_rank()).batch(16, drop_remainder=True)
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 2))
loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
model = Model(net, loss_fn=loss, optimizer=nn.Momentum(net.trainable_params(), 0.05, 0.9))
model.train(2, data, callbacks=[LossMonitor()], dataset_sink_mode=False)

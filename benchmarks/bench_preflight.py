"""Time `run_preflight` over 1,000 generated training-code files.

The files mix what a real training repository holds: PyTorch DDP entry scripts,
MindSpore data-parallel scripts, dataset modules and model definitions, each a few
hundred lines. The issue asks for <= 10 s.

    .venv/bin/python benchmarks/bench_preflight.py [N_FILES]
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
import time
from pathlib import Path

from syncdoctor.preflight import run_preflight
from syncdoctor.preflight.registry import all_checks

TORCH_TRAIN = """
import argparse
import os
import random

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default={epochs})
    p.add_argument("--accum", type=int, default=4)
    return p.parse_args()


def setup_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Net{i}(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 10)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def evaluate(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += torch.nn.functional.cross_entropy(model(x), y).item()
    model.train()
    return total


def main():
    args = parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    setup_seed(42)
    data = TensorDataset(torch.randn(1000, 32), torch.randint(0, 10, (1000,)))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(data, batch_size=32, sampler=sampler, drop_last=True)
    model = DDP(Net{i}().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world_size, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            sync = (i + 1) % args.accum == 0
            ctx = model.no_sync() if not sync else torch.enable_grad()
            with ctx:
                loss = criterion(model(x.cuda()), y.cuda()) / args.accum
                loss.backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad()
        scheduler.step()
        score = evaluate(model, loader)
        if rank == 0:
            print(f"epoch {{epoch}} loss {{score:.4f}}")
            torch.save(model.module.state_dict(), f"ckpt_{{epoch}}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""

MS_TRAIN = """
import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.vision as vision
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import LossMonitor, Model


def create_dataset(path, batch_size={batch}):
    rank_id, rank_size = get_rank(), get_group_size()
    data = ds.Cifar10Dataset(path, num_shards=rank_size, shard_id=rank_id, shuffle=True)
    data = data.map(operations=[vision.Rescale(1.0 / 255.0, 0.0), vision.HWC2CHW()],
                    input_columns="image")
    return data.batch(batch_size, drop_remainder=True)


class Block{i}(nn.Cell):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


def main():
    ms.set_seed(1)
    ds.config.set_seed(1)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL,
                                 gradients_mean=True, device_num=get_group_size())
    net = nn.SequentialCell([Block{i}(3) for _ in range(4)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01 * get_group_size(), momentum=0.9)
    model = Model(net, loss_fn=loss, optimizer=opt, metrics={{"acc"}})
    model.train({epochs}, create_dataset("cifar"), callbacks=[LossMonitor()])


if __name__ == "__main__":
    main()
"""

MODEL_DEF = """
import math

import torch
from torch import nn


class Attention{i}(nn.Module):
    def __init__(self, dim={dim}, heads=8):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.scale = 1.0 / math.sqrt(dim // heads)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).unbind(2)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        return self.proj((attn.softmax(-1) @ v).reshape(b, n, c))


class Mlp{i}(nn.Module):
    def __init__(self, dim={dim}, hidden=4 * {dim}):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block{i}(nn.Module):
    def __init__(self, dim={dim}):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention{i}(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp{i}(dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def build(depth=12):
    return nn.Sequential(*[Block{i}() for _ in range(depth)])
"""

DATA_MODULE = """
import json
import os

import numpy as np
import torch
from torch.utils.data import Dataset


class JsonDataset{i}(Dataset):
    def __init__(self, root, split="train", transform=None):
        self.root = root
        self.transform = transform
        with open(os.path.join(root, split + ".json")) as fh:
            self.items = json.load(fh)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        item = self.items[idx]
        x = np.asarray(item["x"], dtype=np.float32)
        if self.transform is not None:
            x = self.transform(x)
        return torch.from_numpy(x), int(item["y"])


def collate(batch):
    xs, ys = zip(*batch)
    return torch.stack(xs), torch.tensor(ys)
"""

TEMPLATES = [TORCH_TRAIN, MS_TRAIN, MODEL_DEF, DATA_MODULE]


def generate(root: Path, n: int) -> int:
    lines = 0
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        # Repeat a model file's body so files range from ~60 to ~400 lines.
        body = textwrap.dedent(template).format(i=i, epochs=10 + i % 7, batch=32, dim=64 + i % 4)
        if template is MODEL_DEF:
            body += "".join(textwrap.dedent(MODEL_DEF).format(i=f"{i}_{k}", dim=64) for k in range(i % 3))
        pkg = root / f"pkg{i // 100}"
        pkg.mkdir(exist_ok=True)
        (pkg / f"mod{i}.py").write_text(body)
        lines += body.count("\n")
    return lines


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    all_checks()  # import the checks outside the timed part, as the CLI has by then
    with tempfile.TemporaryDirectory() as tmp:
        lines = generate(Path(tmp), n)
        t0 = time.perf_counter()
        findings = run_preflight([tmp])
        seconds = time.perf_counter() - t0
    print(f"{n} files, {lines} lines: {seconds:.2f} s, {len(findings)} findings")
    for f in findings[:5]:
        print("  ", f.render())


if __name__ == "__main__":
    main()

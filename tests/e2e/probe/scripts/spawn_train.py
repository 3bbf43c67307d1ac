"""A script that starts its own ranks with torch.multiprocessing.spawn (no launcher)."""

from __future__ import annotations

import os
import sys

import torch.multiprocessing as mp
from ddp_train import parse, train


def worker(rank: int, world_size: int, args) -> None:  # type: ignore[no-untyped-def]
    train(rank, world_size, args)


if __name__ == "__main__":
    arguments = parse(sys.argv[2:])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = sys.argv[1]
    print("spawning 2 ranks", flush=True)
    mp.spawn(worker, args=(2, arguments), nprocs=2, join=True)
    sys.exit(arguments.exit_code)

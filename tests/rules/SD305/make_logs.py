"""Writes the SD305 log fixtures (seeded, run once): two ranks print a start line with
their seeds, then `it N | loss x` lines.

    python tests/rules/SD305/make_logs.py
"""

from __future__ import annotations

import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write(folder: Path, start: dict[int, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        rng = random.Random(7 + rank)
        lines = ["== job 2 ranks ==", start[rank]]
        lines += [f"it {i} | loss {2.3 * math.exp(-i / 30) * math.exp(rng.gauss(0, 0.05)):.4f}" for i in range(1, 61)]
        (folder / f"rank{rank}.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    write(HERE / "fire_logs", {0: "rank 0: shuffle_seed=1234 batch=32", 1: "rank 1: shuffle_seed=1235 batch=32"})
    write(HERE / "silent_logs", {0: "rank 0: shuffle_seed=1234 batch=32", 1: "rank 1: shuffle_seed=1234 batch=32"})
    # per-worker augmentation streams may differ by rank: not a seed that must be equal
    write(
        HERE / "silent_near_logs",
        {0: "rank 0: shuffle_seed=1234 aug_seed=1234", 1: "rank 1: shuffle_seed=1234 aug_seed=1235"},
    )

"""Writes the SD506/SD602 log fixtures (seeded, run once): two ranks print
`[time] ep E | batch i/40 | loss x` lines and, after training, `final top1 = v`.

    python tests/rules/SD602/make_logs.py
"""

from __future__ import annotations

import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS, PER_EPOCH = 120, 40


def write(folder: Path, drift: float, top1: dict[int, float], extra_field_rank: int | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        rng = random.Random(100 + rank)
        lines = [f"[10:00:00] rank {rank} of 2 ready, {STEPS} steps"]
        for step in range(1, STEPS + 1):
            base = 2.3 * math.exp(-step / 35) + 0.08
            # rank 1's replica takes updates of its own: its gap to rank 0 grows from zero
            grow = 1 + drift * (step / STEPS) ** 2 if rank == 1 else 1.0
            loss = base * grow * math.exp(rng.gauss(0, 0.06))
            ep, i = (step - 1) // PER_EPOCH + 1, (step - 1) % PER_EPOCH + 1
            line = f"[10:{step // 60:02d}:{step % 60:02d}] ep {ep} | batch {i}/{PER_EPOCH} | loss {loss:.4f}"
            if rank == extra_field_rank:
                line += f" | clip_coef {0.5 + rng.random() / 4:.3f}"
            lines.append(line)
        lines.append("[10:02:01] evaluating on the held-out set (2000 images)")
        lines.append(f"[10:02:03] final top1 = {top1[rank]:.4f}")
        (folder / f"rank{rank}.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sd602, sd506 = HERE, HERE.parent / "SD506"
    write(sd602 / "fire_logs", drift=2.5, top1={0: 0.9135, 1: 0.7420})
    write(sd602 / "silent_logs", drift=0.0, top1={0: 0.9135, 1: 0.9135})
    write(sd506 / "fire_logs", drift=0.0, top1={0: 0.9135, 1: 0.8870})
    write(sd506 / "silent_logs", drift=0.0, top1={0: 0.9135, 1: 0.9135})
    write(sd506 / "silent_near_logs", drift=0.0, top1={0: 0.9135, 1: 0.8870}, extra_field_rank=0)
    write(sd506 / "silent_close_logs", drift=0.0, top1={0: 0.9135, 1: 0.9110})

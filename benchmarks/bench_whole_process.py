"""The probe's cost as a user meets it: the whole process, start-up included.

`syncdoctor run -- torchrun ... train.py` against plain `torchrun ... train.py`, the
same 2-rank DDP job each time (an MLP of about 85k parameters on the digits set that
scikit-learn ships, gloo on loopback, one thread per rank), in pairs whose order
alternates (plain first, then probed first), so a drift of the machine's speed falls on
both sides alike. Measured per run: the wall time from launch to exit and the CPU time
of every process the command started (user + system, from the children's rusage: the
launcher, both ranks and, probed, `syncdoctor run` itself). The in-process benchmark
(bench_probe.py) times the training steps only; this one also counts the interpreter
start-ups, the imports and the run folder's set-up that a user pays once per job.

Reported per configuration: the median over pairs of (probed / plain), the range, and
the fixed cost (probed minus plain, in seconds) beside it.

    python benchmarks/bench_whole_process.py                 # 8 pairs x 1,500 steps, K=default and K=1
    python benchmarks/bench_whole_process.py --quick         # 2 pairs x 500 steps
    python benchmarks/bench_whole_process.py --configs default --pairs 4
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"default": 1.02, "every": 1.10}  # probed / plain, wall and CPU alike
CHECK_EVERY = {"default": None, "every": 1}


# ----------------------------------------------------------------------------- the job
def train(steps: int) -> None:
    """What each rank runs: plain DDP training, as a user writes it."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from sklearn.datasets import load_digits

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    shard = torch.arange(rank, len(x), world)
    batch = 32
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        if step % (len(shard) // batch) == 0:
            order = shard[torch.randperm(len(shard), generator=generator)]
        at = (step % (len(shard) // batch)) * batch
        idx = order[at : at + batch]
        loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    # Without the barrier a rank that finishes first tears its group down while the other's
    # last all-reduce is still in flight; gloo then aborts one in about three runs here
    # ("terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- one run
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _command(probed: bool, steps: int, check_every: int | None, out: Path) -> list[str]:
    bin_dir = Path(sys.executable).parent
    torchrun = str(bin_dir / "torchrun") if (bin_dir / "torchrun").exists() else None
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    launcher += ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(_free_port())]
    command = [*launcher, str(Path(__file__).resolve()), "--train", "--steps", str(steps)]
    if not probed:
        return command
    syncdoctor = bin_dir / "syncdoctor"
    head = [str(syncdoctor)] if syncdoctor.exists() else [sys.executable, "-m", "syncdoctor"]
    head += ["run", "--out", str(out)]
    if check_every is not None:
        head += ["--check-every", str(check_every)]
    return [*head, "--", *command]


# torch can abort a rank while the interpreter finalizes, after training ended
# (pytorch/pytorch#190489): libstdc++ prints this line. Such a run is run again (its
# time is not counted), and the count is reported.
EXIT_ABORT = b"terminate called without an active exception"
aborted_at_exit = 0


def run_once(probed: bool, steps: int, check_every: int | None, tmp: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process the command started)."""
    global aborted_at_exit
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    # As a user's installed environment runs: with bytecode. A shell with
    # PYTHONDONTWRITEBYTECODE=1 (and an installer that compiles none, as uv) makes every
    # process compile torch, dynamo and sympy from source again, seconds of CPU per rank
    # on both sides, which hides the probe's cost in the baseline; the untimed first runs
    # write the bytecode.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for _ in range(3):
        out = tmp / f"run-{time.monotonic_ns()}"
        cpu0, t0 = _children_cpu(), time.monotonic()
        proc = subprocess.run(
            _command(probed, steps, check_every, out),
            env=env,
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=1200,
            check=False,
        )
        wall, cpu = time.monotonic() - t0, _children_cpu() - cpu0
        shutil.rmtree(out, ignore_errors=True)
        if proc.returncode == 0:
            return wall, cpu
        if EXIT_ABORT not in proc.stderr:
            break
        aborted_at_exit += 1
    raise SystemExit(f"{'probed' if probed else 'plain'} run failed ({proc.returncode}): {proc.stderr[-2000:]!r}")


# ----------------------------------------------------------------------------- pairs
def measure(config: str, pairs: int, steps: int, tmp: Path) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {k: [] for k in ("plain_wall", "plain_cpu", "probed_wall", "probed_cpu")}
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        for probed in order:
            wall, cpu = run_once(probed, steps, CHECK_EVERY[config], tmp)
            side = "probed" if probed else "plain"
            got[f"{side}_wall"].append(wall)
            got[f"{side}_cpu"].append(cpu)
        print(
            f"  pair {i + 1}/{pairs}: plain {got['plain_wall'][-1]:.2f} s ({got['plain_cpu'][-1]:.2f} CPU-s), "
            f"probed {got['probed_wall'][-1]:.2f} s ({got['probed_cpu'][-1]:.2f} CPU-s)",
            flush=True,
        )
    return got


def summarize(config: str, got: dict[str, list[float]]) -> str:
    lines = []
    for what in ("wall", "cpu"):
        ratios = [p / q for p, q in zip(got[f"probed_{what}"], got[f"plain_{what}"], strict=True)]
        extra = [p - q for p, q in zip(got[f"probed_{what}"], got[f"plain_{what}"], strict=True)]
        median = statistics.median(ratios)
        target = TARGETS[config]
        lines.append(
            f"  {what:4s} x{median:.3f} (median of {len(ratios)} pairs; range {min(ratios):.3f}-{max(ratios):.3f}), "
            f"+{statistics.median(extra):.2f} s per job; plain {statistics.median(got[f'plain_{what}']):.2f} s; "
            f"target <= {target}: {'met' if median <= target else 'MISSED'}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per job (default 1500; --quick 500)")
    p.add_argument("--pairs", type=int, default=0, help="pairs per configuration (default 8; --quick 2)")
    p.add_argument("--configs", default="default,every", help="default (the default K) and/or every (K=1)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.train:
        train(args.steps)
        return
    steps = args.steps or (500 if args.quick else 1500)
    pairs = args.pairs or (2 if args.quick else 8)
    with tempfile.TemporaryDirectory(prefix="sd-whole-") as name:
        tmp = Path(name)
        run_once(False, 20, None, tmp)  # untimed: the first start-up compiles bytecode and warms the page cache
        run_once(True, 20, None, tmp)
        for config in args.configs.split(","):
            print(f"{config} (check every {CHECK_EVERY[config] or 'default K'}): {pairs} pairs x {steps} steps")
            got = measure(config, pairs, steps, tmp)
            print(summarize(config, got), flush=True)
    if aborted_at_exit:
        print(f"runs that torch aborted at exit after training, run again: {aborted_at_exit}")


if __name__ == "__main__":
    main()

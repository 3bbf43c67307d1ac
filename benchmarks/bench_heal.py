"""What a heal costs: the time to restore one replica of N bytes over the job's own
process group (parameters, buffers and the optimizer state, broadcast from a
majority rank), and the store round trips of the meeting before it.

    python benchmarks/bench_heal.py [--world-size 3] [--sizes-mb 1 10 100] [--repeats 5] [--json]
    python benchmarks/bench_heal.py --check-cost [--world-size 4] [--steps 400] [--check-every 10]

It starts `--world-size` real processes (gloo over 127.0.0.1, one thread each) that
hold a model of the given parameter size with SGD momentum (so the optimizer state
is as large again) and time syncdoctor.probe.torch.heal.restore_from, the function a heal
runs, between barriers; the figure is the slowest rank's time, median of the
repeats. The meeting (one store `add` per rank, then a compare_set and a poll) is
timed alone as `meet_ms`.

`--check-cost` measures what "heal" adds to every check when nothing is healed: a
real data-parallel job (a small MLP, all-reduced gradients, the probe attached with
on_mismatch="heal") times, on every rank, the two heal-only calls of each check — the
joint decision after the post (Healer.after_post: the count, the reader's wait for
every post and its read, the others' wait for the decision) and the plan lookup
(Healer.at_check) — and reports their median and 90th percentile per check, with the
mean step time (`--on-mismatch warn` runs the same job without heal, to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def rank_main() -> None:
    import torch
    import torch.distributed as dist

    from syncdoctor.probe.torch.check import job_store
    from syncdoctor.probe.torch.heal import restore_from

    sizes_mb = [float(s) for s in os.environ["BENCH_SIZES_MB"].split(",")]
    repeats = int(os.environ["BENCH_REPEATS"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    store = job_store(30.0)
    rows = []
    for size_mb in sizes_mb:
        # Layers of at most 4M floats, as a real model's tensors are many, not one.
        floats = int(size_mb * (1 << 20) / 4)
        layers = [min(1 << 22, floats - i) for i in range(0, floats, 1 << 22)]
        model = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(n)) for n in layers])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()  # momentum buffers exist: the optimizer state is as large as the parameters
        named = list(model.named_parameters())
        times, meets, sent = [], [], 0
        for r in range(repeats):
            dist.barrier()
            t0 = time.perf_counter()
            key = f"bench/{size_mb}/{r}"
            if store.add(f"{key}/arrived", 1) == world:
                store.compare_set(f"{key}/state", "", "go")
            while not store.check([f"{key}/state"]):
                time.sleep(0.002)
            store.get(f"{key}/state")
            meet = time.perf_counter() - t0
            dist.barrier()
            t0 = time.perf_counter()
            sent = restore_from(0, model, optimizer, named)
            elapsed = torch.tensor([time.perf_counter() - t0, meet], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            times.append(float(elapsed[0]))
            meets.append(float(elapsed[1]))
        median = statistics.median(times)
        rows.append(
            {
                "world_size": world,
                "param_mb": size_mb,
                "bytes": sent,
                "restore_ms": round(median * 1e3, 2),
                "restore_ms_min": round(min(times) * 1e3, 2),
                "gb_per_s": round(sent / median / 1e9, 3),
                "meet_ms": round(statistics.median(meets) * 1e3, 2),
                "backend": dist.get_backend(),
            }
        )
        del model, optimizer
    if rank == 0:
        print("BENCH " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def check_cost_main() -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    import syncdoctor
    from syncdoctor.probe.torch.heal import Healer

    steps, every = int(os.environ["BENCH_STEPS"]), int(os.environ["BENCH_CHECK_EVERY"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    timings: dict[str, list[float]] = {"after_post": [], "at_check": []}

    def timed(name: str, method):  # noqa: ANN001, ANN202 - wraps a Healer method
        def run(self, *args):  # noqa: ANN001, ANN202
            t0 = time.perf_counter()
            try:
                return method(self, *args)
            finally:
                timings[name].append(time.perf_counter() - t0)

        return run

    Healer.after_post = timed("after_post", Healer.after_post)  # type: ignore[method-assign]
    Healer.at_check = timed("at_check", Healer.at_check)  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    probe = syncdoctor.attach(
        model,
        optimizer,
        run_dir=os.environ["BENCH_RUN_DIR"],
        check_every=every,
        on_mismatch=os.environ["BENCH_ON_MISMATCH"],
    )
    data = torch.Generator().manual_seed(rank)
    t0 = time.perf_counter()
    for _ in range(steps):
        x = torch.randn(32, 64, generator=data)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (32,), generator=data))
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        optimizer.step()
    step_ms = (time.perf_counter() - t0) / steps * 1e3
    probe.close()
    row = {"rank": rank, "step_ms": step_ms}
    for name, values in timings.items():
        us = np.array(values) * 1e6
        row[name] = {
            "checks": len(values),
            "median_us": float(np.median(us)) if len(us) else None,
            "p90_us": float(np.percentile(us, 90)) if len(us) else None,
        }
    rows: list[dict] = [{}] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if rank == 0:
        print("BENCH " + json.dumps(rows), flush=True)
    dist.destroy_process_group()


def run_bench_ranks(world_size: int, **bench_env: str) -> list[dict]:
    """This file on `world_size` ranks with the BENCH_* settings given; rank 0's rows."""
    from syncdoctor.lab.launch import free_port, run_ranks

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        logs = [Path(tmp) / f"rank{r}.log" for r in range(world_size)]
        envs = [
            dict(
                os.environ,
                RANK=str(r),
                WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                OMP_NUM_THREADS="1",
                GLOO_SOCKET_IFNAME="lo",
                **{k: v.replace("{tmp}", tmp) for k, v in bench_env.items()},
            )
            for r in range(world_size)
        ]
        codes, timed_out = run_ranks([[sys.executable, __file__]] * world_size, envs, logs, timeout_s=900)
        text = logs[0].read_text()
        line = next((ln for ln in text.splitlines() if ln.startswith("BENCH ")), None)
        if line is None or timed_out or any(codes):
            sys.exit(f"bench failed (exit codes {codes}, timed out {timed_out}):\n{text[-3000:]}")
    return json.loads(line[len("BENCH ") :])


def check_cost(args: argparse.Namespace) -> None:
    rows = run_bench_ranks(
        args.world_size,
        BENCH_RANK_MAIN="check",
        BENCH_STEPS=str(args.steps),
        BENCH_CHECK_EVERY=str(args.check_every),
        BENCH_RUN_DIR="{tmp}/run",
        BENCH_ON_MISMATCH=args.on_mismatch,
    )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{args.world_size} ranks, {args.steps} steps, K = {args.check_every}, on_mismatch={args.on_mismatch}, "
        "nothing healed"
    )
    print("| rank | step (mean) | checks | decision after the post: median, p90 | plan lookup: median, p90 |")
    print("|---|---|---|---|---|")
    for r in rows:
        a, b = r["after_post"], r["at_check"]
        if not a["checks"]:
            print(f"| {r['rank']} | {r['step_ms']:.2f} ms | — | — | — |")
            continue
        print(
            f"| {r['rank']} | {r['step_ms']:.2f} ms | {a['checks']} | {a['median_us']:.0f} µs, {a['p90_us']:.0f} µs | "
            f"{b['median_us']:.0f} µs, {b['p90_us']:.0f} µs |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--check-cost", action="store_true", help="time the heal-only work of every check instead")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--check-every", type=int, default=10)
    parser.add_argument(
        "--on-mismatch", default="heal", help="with --check-cost: heal, or warn for the step time without it"
    )
    args = parser.parse_args()
    if args.check_cost:
        check_cost(args)
        return
    rows = run_bench_ranks(
        args.world_size,
        BENCH_RANK_MAIN="1",
        BENCH_SIZES_MB=",".join(map(str, args.sizes_mb)),
        BENCH_REPEATS=str(args.repeats),
    )
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| ranks | model params | bytes restored (params + momentum) | restore (median) | rate | meeting |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['world_size']} | {r['param_mb']:g} MiB | {r['bytes']:,} | {r['restore_ms']} ms | "
            f"{r['gb_per_s']} GB/s | {r['meet_ms']} ms |"
        )


if __name__ == "__main__":
    if os.environ.get("BENCH_RANK_MAIN") == "check":
        check_cost_main()
    elif os.environ.get("BENCH_RANK_MAIN"):
        rank_main()
    else:
        main()

"""The live check at 1,024 and 8,192 ranks: store traffic and per-rank cost.

The check (probe/torch/check.py) needs no collective: every rank writes one block of check
rows to the job's c10d TCPStore per block (one `set`, no reply awaited by the
protocol), and one rank in turn reads the block back (`check` + `multi_get` of N
keys) and compares it. This benchmark runs that exchange for real against a real
TCPStore on loopback, with N light clients (one TCP connection each, spread over a
few processes) standing in for the ranks, and measures:

- a rank's write: the latency of one `set` of a block, while all N ranks write the
  same block at once (the burst at a check step), p50 and p99;
- the store absorbing the burst: from the first write to the last acknowledged;
- the reader: `check` + `multi_get` of the N rows and the comparison (numpy), and the
  bytes it moves.

From these it prints the probe's check cost per rank and step at the default interval
(K = 50, blocks of 2 checks: one write every 100 steps, one read every N blocks) and
the store's share of busy time, measured where it ran and extrapolated (linear in N,
from the per-operation costs measured) where it did not.

    .venv/bin/python benchmarks/bench_check_scale.py [--ranks 1024,8192] [--blocks 3] [--max-connections 1024]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from datetime import timedelta

import numpy as np

# A check row: counter, 13 fields, 4 placement classes x 4, data key, 64 tensor groups.
ROW_INT64 = 1 + 13 + 16 + 1 + 64
DEFAULT_K = 50
READ_EVERY_STEPS = 100


def _block(checks: int, rank: int, block: int) -> bytes:
    rows = np.full((checks, ROW_INT64), block, dtype=np.int64)
    rows[:, 0] = np.arange(checks) + block * checks
    return np.array([checks, ROW_INT64, *rows.reshape(-1)], dtype=np.int64).tobytes()


def _clients(port: int, ranks: list[int], connections: int, checks: int, blocks: int, barrier, results) -> None:  # type: ignore[no-untyped-def]
    import torch.distributed as dist

    stores = [
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=300), wait_for_workers=False)
        for _ in range(connections)
    ]
    payload = {r: [_block(checks, r, b) for b in range(blocks)] for r in ranks}
    latencies: list[float] = []
    for block in range(blocks):
        barrier.wait()  # every rank reaches the check step together: the worst burst
        for i, rank in enumerate(ranks):
            t0 = time.perf_counter()
            stores[i % connections].set(f"{block}/{rank}", payload[rank][block])
            latencies.append(time.perf_counter() - t0)
        barrier.wait()
    results.put(latencies)


def measure(n_ranks: int, blocks: int, processes: int, max_connections: int) -> dict[str, float]:
    import torch.distributed as dist

    checks = max(1, min(READ_EVERY_STEPS // DEFAULT_K, 50, 4096 // n_ranks))
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=300), wait_for_workers=False)
    reader = dist.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=300), wait_for_workers=False
    )
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    share = [list(range(n_ranks))[p::processes] for p in range(processes)]
    # One connection per rank up to max_connections; past that the ranks share them (a
    # store write costs the server the same whichever socket it comes in on).
    per_process = max(1, min(n_ranks, max_connections) // processes)
    procs = [
        ctx.Process(
            target=_clients, args=(server.port, ranks, min(per_process, len(ranks)), checks, blocks, barrier, results)
        )
        for ranks in share
    ]
    for proc in procs:
        proc.start()
    bursts, reads, read_bytes = [], [], 0
    for block in range(blocks):
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        bursts.append(time.perf_counter() - t0)
        keys = [f"{block}/{r}" for r in range(n_ranks)]
        t1 = time.perf_counter()
        assert reader.check(keys)
        values = reader.multi_get(keys)
        table = np.stack([np.frombuffer(v, dtype=np.int64)[2:].reshape(checks, ROW_INT64) for v in values])
        _ = (table == table[:1]).all(axis=(0, 2))
        reads.append(time.perf_counter() - t1)
        read_bytes = sum(len(v) for v in values)
    latencies: list[float] = []
    for _ in procs:
        latencies += results.get(timeout=600)
    for proc in procs:
        proc.join(timeout=60)
    latencies.sort()
    return {
        "ranks": n_ranks,
        "connections": min(n_ranks, max_connections),
        "checks_per_block": checks,
        "set_p50_ms": 1e3 * statistics.median(latencies),
        "set_p99_ms": 1e3 * latencies[int(0.99 * (len(latencies) - 1))],
        "burst_s": statistics.median(bursts),
        "read_s": statistics.median(reads),
        "read_mb": read_bytes / 2**20,
        "per_write_server_us": 1e6 * statistics.median(bursts) / n_ranks,
    }


def report(m: dict[str, float], measured: bool) -> None:
    steps_per_block = m["checks_per_block"] * DEFAULT_K
    # Per rank and step: its own write every block, and its turn to read every N blocks.
    per_step_us = 1e6 * (m["set_p50_ms"] / 1e3 / steps_per_block + m["read_s"] / (m["ranks"] * steps_per_block))
    how = "measured" if measured else "extrapolated"
    if measured and m.get("connections", m["ranks"]) < m["ranks"]:
        how += f" over {int(m['connections'])} connections"
    print(
        f"{int(m['ranks']):>6} ranks ({how}): block of {int(m['checks_per_block'])} checks every {steps_per_block} steps; "
        f"write p50 {m['set_p50_ms']:.2f} ms p99 {m['set_p99_ms']:.2f} ms under the burst; "
        f"store absorbs the burst in {m['burst_s'] * 1e3:.0f} ms ({m['per_write_server_us']:.0f} us/write); "
        f"one read {m['read_s'] * 1e3:.0f} ms for {m['read_mb']:.1f} MiB; "
        f"check cost per rank and step {per_step_us:.2f} us; "
        f"store busy {100 * m['burst_s'] / steps_per_block:.3f} s per 100 s of 1-second steps"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="1024,8192")
    parser.add_argument(
        "--measure-up-to",
        type=int,
        default=8192,
        help="sizes above this are extrapolated from the largest measured one",
    )
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument(
        "--max-connections",
        type=int,
        default=1024,
        help="client connections at most (opening 8,192 here takes longer than the run); "
        "past it the ranks' writes share them",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.ranks.split(",")]
    last: dict[str, float] | None = None
    for n in sizes:
        if n <= args.measure_up_to:
            last = measure(n, args.blocks, args.processes, args.max_connections)
            report(last, measured=True)
        elif last is not None:
            scale = n / last["ranks"]
            checks = max(1, min(READ_EVERY_STEPS // DEFAULT_K, 50, 4096 // n))
            est = {
                **last,
                "ranks": n,
                "checks_per_block": checks,
                "burst_s": last["burst_s"] * scale,
                "read_s": last["read_s"] * scale * checks / last["checks_per_block"],
                "read_mb": last["read_mb"] * scale * checks / last["checks_per_block"],
            }
            report(est, measured=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the doctor's log ingestion against `grep -E -c` over the same file.

Generates a mixed training log (mostly uninteresting lines, ~1% loss lines in
several formats, ~0.05% communication/process events, some keyword noise such as
NCCL INFO chatter), then times

    grep -E -c '<the ingestion's own keyword alternation>' FILE
    syncdoctor.doctor.ingest.ingest_logs([FILE])   (in a child process, for its peak RSS)

and prints both times and their ratio. The target (issue 23) is ingestion within 2x of
grep's time (ratio <= 2). The generated file is deleted afterwards unless --keep.

    .venv/bin/python benchmarks/bench_logparse.py            # 1 GB
    .venv/bin/python benchmarks/bench_logparse.py --size 200M
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BORING = (
    "2026-11-29 10:12:{s:02d},{ms:03d} INFO [data_loader.py:120] prefetch queue size 64, batch {n} fetched in 0.012s",
    "[2026-11-29 10:12:{s:02d}] worker {w} read shard /data/imagenet/train-{n:05d}-of-01024 (32 images)",
    "Iteration timing: fwd 12.{w}ms bwd 25.1ms opt 3.2ms comm 4.{s}ms",
    "[WARNING] ME(31211:281473590168608,MainProcess):2026-11-29-10:00:{s:02d}.000.000 [mindspore/dataset/engine/datasets.py:1200] Repeat is located before batch, data from two epochs can be batched together.",
    "  5%|\u258c         | {n}/100000 [00:10<03:10,  5.00it/s]",
    "[INFO] GE(31211,python):2026-11-29-10:00:{s:02d}.123.456 [graph_optimizer.cc:{n}] Optimize graph pass {w} finished, nodes 1024",
    "/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py:558: UserWarning: This DataLoader will create 8 worker processes in total.",
)
# keyword hits that are not events: they cost parsing but must yield nothing
NOISE = (
    "gpu-node-1:1234:1300 [0] NCCL INFO Channel {w:02d}/02 :    0   1",
    "[MS_RUNTIME] graph compile phase {w} done, memory usage {n}MB",
    "checkpoint saved to /ckpt/step_{n}.ckpt (exit code of uploader: 0 pending)",
)
EVENTS = (
    "[rank{w}]:[E1129 10:40:{s:02d}.123456 4001 ProcessGroupNCCL.cpp:616] [Rank {w}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={n}, OpType=ALLREDUCE, NumelIn=2785034, NumelOut=2785034, Timeout(ms)=600000) ran for 600047 milliseconds before timing out.",
    "[WARNING] DISTRIBUTED(2001,ffff8a3b1020,python):2026-11-29-10:00:{s:02d}.100.000 [mindspore/ccsrc/distributed/cluster/cluster_context.cc:255] BuildCluster] Topology build timed out., retry({w}/120).",
    "[ERROR] HCCL(12345,python):2026-11-29-10:05:{s:02d}.123.456 [hccl_socket_manager.cc:778] [12399][Wait][LinkEstablish]wait socket establish timeout, role[1] rank[{w}] timeout[120]",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:{n}",
)


def _loss_line(step: int, rng: random.Random) -> str:
    loss = 2.0 / (1 + step / 5000) + rng.random() * 0.05
    kind = step % 4
    if kind == 0:
        return f"2026-11-29 10:12:01,123 | rank {step % 8} | epoch 1 | step {step} | loss {loss:.6f} | lr 0.050000 | grad_norm 1.2345"
    if kind == 1:
        return f"epoch: 1 step: {step}, loss is {loss:.4f}"
    if kind == 2:
        return f"{{'loss': {loss:.4f}, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}}"
    return f"step={step} loss={loss:.4f} lr=0.001 grad_norm=0.91"


def generate(path: Path, size: int, seed: int = 0) -> dict[str, int]:
    """Write ~size bytes of mixed log; return line counts by category."""
    rng = random.Random(seed)

    def fmt(t: str) -> str:
        return t.format(s=rng.randrange(60), ms=rng.randrange(1000), n=rng.randrange(100000), w=rng.randrange(8))

    # One pool of boring lines, reused block after block: generating every line
    # in Python would make the benchmark slower to set up than to run.
    pool = [fmt(rng.choice(BORING)) for _ in range(40_000)]
    counts = {"lines": 0, "loss": 0, "event": 0, "noise": 0}
    written = 0
    step = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            lines = list(pool)
            for i in range(0, len(lines), 100):  # 1% loss lines
                step += 1
                lines[i] = _loss_line(step, rng)
                counts["loss"] += 1
            for i in range(37, len(lines), 400):  # 0.25% keyword noise
                lines[i] = fmt(rng.choice(NOISE))
                counts["noise"] += 1
            for i in range(71, len(lines), 2000):  # 0.05% events
                lines[i] = fmt(rng.choice(EVENTS))
                counts["event"] += 1
            block = "\n".join(lines) + "\n"
            f.write(block)
            written += len(block.encode("utf-8"))
            counts["lines"] += len(lines)
    return counts


TARGET = 2.0  # ingestion within this factor of grep's wall time


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _child_ingest(path: str) -> None:
    from syncdoctor.doctor.ingest import ingest_logs

    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    data = ingest_logs([path])
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    peak_kib = after.ru_maxrss
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "cpu_seconds": cpu,
                "peak_rss_mib": peak_kib / 1024,
                "loss_rows": data.losses.height,
                "events": len(data.events),
                "warnings": len(data.warnings),
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1G", help="size of the generated log (e.g. 200M, 1G); default 1G")
    parser.add_argument("--dir", default=None, help="where to write the log (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each; the best counts (default 3)")
    parser.add_argument("--_ingest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._ingest:
        _child_ingest(args._ingest)
        return 0

    from syncdoctor.doctor.ingest.scan import EVENT_LITERALS, LOSS_LITERALS

    workdir = Path(tempfile.mkdtemp(prefix="bench_logparse_", dir=args.dir))
    path = workdir / "mixed_train.log"
    try:
        t0 = time.perf_counter()
        counts = generate(path, _parse_size(args.size))
        size = path.stat().st_size
        print(
            f"generated {size / 1e6:.0f} MB, {counts['lines']} lines ({counts['loss']} loss, "
            f"{counts['event']} events, {counts['noise']} keyword noise) in {time.perf_counter() - t0:.1f}s"
        )
        os.sync()  # let the writes reach the disk: write-back would slow the timed runs
        with open(path, "rb") as f:  # warm the page cache so both runs read from memory
            while f.read(1 << 24):
                pass
        pattern = "|".join(LOSS_LITERALS + EVENT_LITERALS)
        grep = shutil.which("grep") or "grep"
        # Best of N for both: the machine may be shared, and noise only ever adds time.
        grep_runs, grep_cpu = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run([grep, "-E", "-c", pattern, str(path)], capture_output=True, text=True, check=False)
            grep_runs.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            grep_cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        grep_s = min(grep_runs)
        print(
            f"grep -E -c (same {pattern.count('|') + 1} keywords): best {grep_s:.2f}s of "
            f"{', '.join(f'{x:.2f}' for x in grep_runs)} (CPU {min(grep_cpu):.2f}s); "
            f"{out.stdout.strip()} matching lines"
        )
        results = []
        for _ in range(args.repeat):
            child = subprocess.run(
                [sys.executable, __file__, "--_ingest", str(path)],
                capture_output=True,
                text=True,
                check=True,
            )
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
        result = min(results, key=lambda r: r["seconds"])
        runs = ", ".join(f"{r['seconds']:.2f}" for r in results)
        print(
            f"ingest_logs: best {result['seconds']:.2f}s of {runs} "
            f"(CPU {min(r['cpu_seconds'] for r in results):.2f}s, several threads); "
            f"peak RSS {max(r['peak_rss_mib'] for r in results):.0f} MiB, "
            f"{result['loss_rows']} loss rows, {result['events']} events kept, {result['warnings']} warnings"
        )
        ratio = result["seconds"] / grep_s
        print(
            f"ratio ingest/grep: {ratio:.2f}x ({size / 1e6 / result['seconds']:.0f} MB/s vs {size / 1e6 / grep_s:.0f} MB/s)"
            f" -> {'OK' if ratio <= TARGET else f'SLOWER than the {TARGET:g}x target'}; "
            f"CPU-time ratio {min(r['cpu_seconds'] for r in results) / max(min(grep_cpu), 1e-9):.2f}x"
        )
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

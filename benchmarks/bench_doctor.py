"""Doctor at scale: generated probe records for R ranks × S steps, diagnosed end to end.

Target (doctor issue): 256 ranks × 10,000 steps in ≤ 20 s and ≤ 4 GiB here, cost
growing linearly. Prints wall time and peak RSS for each size, and the time per
rank-step so linearity is visible.

    .venv/bin/python benchmarks/bench_doctor.py [--ranks 256] [--steps 10000] [--sizes 0.25,0.5,1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECK_EVERY = 10


def generate(run_dir: Path, ranks: int, steps: int, bad_rank: int, onset: int) -> int:
    """Records as the probe writes them: every step light, every 10th with fingerprints.
    One rank skips an update at `onset`, so the doctor has a real divergence to find."""
    rec_dir = run_dir / "records"
    rec_dir.mkdir(parents=True)
    total = 0
    names = [f"layer{i}.weight" for i in range(50)]
    for rank in range(ranks):
        rng = random.Random(rank)
        lines = [
            json.dumps(
                {
                    "v": 1,
                    "kind": "snapshot",
                    "rank": rank,
                    "world_size": ranks,
                    "framework": "torch",
                    "host": f"node{rank // 8}",
                    "env": {"RANK": str(rank), "LOCAL_RANK": str(rank % 8)},
                    "versions": {"torch": "2.13.0"},
                    "code": {"entry_sha256": "ab" * 32, "files": {}},
                    "loss": {"type": "CrossEntropyLoss", "params": {}},
                    "optimizer": {"type": "SGD", "param_groups": [{"lr": 0.1, "momentum": 0.9}]},
                    "ddp": {"wrapper": "DistributedDataParallel", "broadcast_buffers": True},
                    "loader": {
                        "batch_size": 32,
                        "dataset_len": 1_281_167,
                        "num_replicas": ranks,
                        "rank": rank,
                        "drop_last": True,
                    },
                    "global_batch": 32 * ranks,
                    "tensors": names,
                    "init_param_fp": 12345,
                },
                separators=(",", ":"),
            )
        ]
        skipped = 0
        for step in range(1, steps + 1):
            if rank == bad_rank and step == onset:
                skipped = 1
            loss = 2.3 * (0.9995**step) * (1 + 0.3 * (rng.random() - 0.5))
            rec = {
                "v": 1,
                "kind": "step",
                "rank": rank,
                "step": step,
                "micro": 1 + (rank == bad_rank and step == onset),
                "backward": step + skipped,
                "opt_steps": step,
                "t": 1.7e9 + step * 0.3,
                "loss": loss,
                "lr": 0.1,
                "samples": 32,
                "data_fp": rng.getrandbits(62),
                "loss_scale": None,
                "overflow": None,
            }
            if step % CHECK_EVERY == 0 or step == 1:
                fp = step * 1_000_003 + (skipped * 7919 if step >= onset else 0) * (rank == bad_rank)
                rec.update(
                    {
                        "param_fp": fp,
                        "grad_fp": fp + 1,
                        "opt_fp": fp + 2,
                        "buffer_fp": fp + 3,
                        "train_mode": "60/60",
                        "grad_norm": 1.0 + rng.random(),
                        "grad_norm_local": 1.3 + rng.random(),
                    }
                )
            lines.append(json.dumps(rec, separators=(",", ":")))
        lines.append(
            json.dumps(
                {"v": 1, "kind": "end", "rank": rank, "step": steps, "t": 1.7e9 + steps, "status": "ok", "message": ""},
                separators=(",", ":"),
            )
        )
        data = ("\n".join(lines) + "\n").encode()
        (rec_dir / f"rank{rank}.jsonl").write_bytes(data)
        total += len(data)
    return total


def finish(run_dir: Path) -> None:
    """Date the records an hour back, as a finished run's are: the reader does not cache
    files written in the last seconds (records/cache.py)."""
    past = time.time() - 3600
    for path in (run_dir / "records").iterdir():
        os.utime(path, (past, past))


def measure(run_dir: Path, cache: bool = True) -> tuple[float, float, str]:
    """Diagnose in a fresh process: wall seconds, peak RSS in GiB, top finding.
    ``cache``: whether the reader may read and write its columnar cache."""
    code = (
        "import json,resource,sys,time; t=time.perf_counter();"
        "from syncdoctor.doctor.diagnose import diagnose; d=diagnose([sys.argv[1]]);"
        "from syncdoctor.doctor.report import render_json; render_json(d);"
        "print(json.dumps({'s': time.perf_counter()-t,"
        "'rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/2**20,"
        "'top': d.findings[0].code if d.findings else None}))"
    )
    env = {**os.environ, "SYNCDOCTOR_RECORDS_CACHE": "1" if cache else "0"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(run_dir)], capture_output=True, text=True, check=True, env=env
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["s"], data["rss"], data["top"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--sizes", default="0.25,0.5,1", help="fractions of --steps to show linearity")
    args = parser.parse_args()
    print(f"doctor scale benchmark: {args.ranks} ranks, steps {args.sizes} × {args.steps}")
    for frac in [float(s) for s in args.sizes.split(",")]:
        steps = max(100, int(args.steps * frac))
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            size = generate(Path(tmp), args.ranks, steps, bad_rank=args.ranks - 1, onset=steps // 2)
            gen_s = time.perf_counter() - t0
            finish(Path(tmp))
            runs = {
                "no cache": measure(Path(tmp), cache=False),
                "cold cache": measure(Path(tmp)),  # reads the JSON lines, writes the cache
                "warm cache": measure(Path(tmp)),
            }
            cache_file = Path(tmp) / ".syncdoctor" / "cache" / "records.parquet"
            cached = cache_file.stat().st_size if cache_file.exists() else 0
        rank_steps = args.ranks * steps
        print(
            f"  {args.ranks} × {steps:>6} = {rank_steps:>9,} rank-steps, {size / 2**20:7.0f} MiB records "
            f"({size / rank_steps:.0f} B/rank-step; generated in {gen_s:.0f}s), "
            f"columnar cache {cached / 2**20:.0f} MiB ({cached / rank_steps:.1f} B/rank-step)"
        )
        for name, (seconds, rss, top) in runs.items():
            print(
                f"    {name:>10}: diagnosed in {seconds:6.2f}s, peak RSS {rss:.2f} GiB, "
                f"{seconds / rank_steps * 1e6:.2f} µs/rank-step, top finding {top}"
            )


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()

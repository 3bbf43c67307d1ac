"""Doctor at scale: generated probe records for R ranks × S steps, diagnosed end to end.

Targets (issue 24): 256 ranks × 10,000 steps in ≤ 10 s and ≤ 1 GiB; 1,024 × 100,000 in
≤ 10 minutes and ≤ 4 GiB on this 2-core machine, top finding right (rank, step, tensor);
4,096 × 100,000 extrapolated from the measured curve.

Each size's records are generated once as the probe writes them (JSON lines: a fault
on a few ranks at a late step, the live check naming the tensor) into
DATA/r{R}s{S}/ (kept: 1,024 × 100,000 is 23 GB and takes many minutes to write; delete
DATA at the end), and, with --twin, a healthy twin into DATA/r{R}s{S}-twin/. Then, each
in a fresh process running the command people run (`syncdoctor diagnose RUN --json`,
imports included): a cold diagnosis (no cache yet: the JSON lines are converted into
the columnar cache, then diagnosed), a warm one, the twin's, and with --whole the run
read whole (SYNCDOCTOR_FULL_DETAIL_ROWS=0; only for sizes that fit in memory). Printed:
wall, peak RSS, bytes per rank-step (JSON lines, cache), the top finding and whether it
is the fault's (ranks, step, tensor); then a line fitted through the measured sizes
(wall and RSS against rank-steps) and what it gives for 4,096 × 100,000.

    PYTHONPATH=src .venv/bin/python benchmarks/bench_doctor.py --data /work/bench24 \
        --sizes 256x10000,1024x10000,1024x100000 --twin 256x10000,1024x10000 --whole 256x10000
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


def generate(
    run_dir: Path,
    ranks: int,
    steps: int,
    bad_rank: int | None = None,
    onset: int = 0,
    bad_ranks: tuple[int, ...] = (),
    only: range | None = None,
) -> int:
    """Records as the probe writes them: every step light, every 10th with fingerprints,
    written one rank file at a time (memory for one rank's chunk, whatever the size).
    The ranks in ``bad_ranks`` (or ``bad_rank``) skip an update at `onset`, so the doctor
    has a real divergence to find, and the live check at the next check step reports
    it, naming the first differing tensor (FAULT_TENSOR) as the probe does; with no bad
    rank the run is the healthy twin. ``only``: write these ranks' files alone (to
    write a big run in several processes)."""
    bad = set(bad_ranks) | ({bad_rank} if bad_rank is not None else set())
    rec_dir = run_dir / "records"
    rec_dir.mkdir(parents=True, exist_ok=only is not None)
    total = 0
    names = [f"layer{i}.weight" for i in range(50)]
    check_step = -(-onset // CHECK_EVERY) * CHECK_EVERY if bad else None
    light = (
        '{"v":1,"kind":"step","rank":%d,"step":%d,"micro":%d,"backward":%d,"opt_steps":%d,"t":%r,"loss":%r,'
        '"lr":0.1,"samples":32,"data_fp":%d,"loss_scale":null,"overflow":null'
    )
    detailed = (
        ',"param_fp":%d,"grad_fp":%d,"opt_fp":%d,"buffer_fp":%d,"train_mode":"60/60","grad_norm":%r,'
        '"grad_norm_local":%r}\n'
    )
    for rank in only if only is not None else range(ranks):
        rng = random.Random(rank)
        rand, bits = rng.random, rng.getrandbits
        mine = rank in bad
        with (rec_dir / f"rank{rank}.jsonl").open("w") as fh:
            fh.write(json.dumps(_snapshot(rank, ranks, names), separators=(",", ":")) + "\n")
            chunk: list[str] = []
            skipped = 0
            for step in range(1, steps + 1):
                micro = 1
                if mine and step == onset:
                    skipped, micro = 1, 2
                loss = 2.3 * (0.9995**step) * (1 + 0.3 * (rand() - 0.5))
                line = light % (rank, step, micro, step + skipped, step, 1.7e9 + step * 0.3, loss, bits(62))
                if step % CHECK_EVERY == 0 or step == 1:
                    fp = step * 1_000_003 + (skipped * 7919 if mine and step >= onset else 0)
                    line += detailed % (fp, fp + 1, fp + 2, fp + 3, 1.0 + rand(), 1.3 + rand())
                else:
                    line += "}\n"
                chunk.append(line)
                if step == check_step:
                    chunk.append(_mismatch(rank, step, ranks, sorted(bad)))
                if len(chunk) >= 4096:
                    fh.write("".join(chunk))
                    chunk.clear()
            end = {
                "v": 1,
                "kind": "end",
                "rank": rank,
                "step": steps,
                "t": 1.7e9 + steps,
                "status": "ok",
                "message": "",
            }
            chunk.append(json.dumps(end, separators=(",", ":")) + "\n")
            fh.write("".join(chunk))
            total += fh.tell()
    return total


FAULT_TENSOR = "layer17.weight"


def _mismatch(rank: int, step: int, ranks: int, bad: list[int]) -> str:
    """The live check's mismatch record, as every rank's file holds it (the probe copies
    it into the other ranks' files)."""
    rec = {
        "v": 1,
        "kind": "check",
        "rank": rank,
        "step": step,
        "status": "mismatch",
        "what": ["param", "counter"],
        "ranks": bad,
        "tensor": FAULT_TENSOR,
        "detail": {"reader": 0, "tensors_differ": [1, 50]},
    }
    return json.dumps(rec, separators=(",", ":")) + "\n"


def _snapshot(rank: int, ranks: int, names: list[str]) -> dict[str, object]:
    return {
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
    }


def finish(run_dir: Path) -> None:
    """Date the records an hour back, as a finished run's are: the reader does not cache
    files written in the last seconds (records/cache.py)."""
    past = time.time() - 3600
    for path in (run_dir / "records").iterdir():
        os.utime(path, (past, past))


def fault(ranks: int, steps: int) -> tuple[tuple[int, ...], int]:
    """The bad ranks (three, spread over the job) and the late onset step of a size."""
    return tuple(sorted({3, ranks // 2 + 5, ranks - 3})), steps * 9 // 10 + 3


def ensure(data: Path, ranks: int, steps: int, twin: bool, jobs: int) -> Path:
    """The size's run folder, generated unless a finished one is there."""
    run_dir = data / f"r{ranks}s{steps}{'-twin' if twin else ''}"
    done = run_dir / ".generated"
    if done.exists():
        return run_dir
    if run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    bad, onset = fault(ranks, steps)
    args = {"bad_ranks": () if twin else bad, "onset": onset}
    t0 = time.perf_counter()
    cuts = [ranks * i // jobs for i in range(jobs + 1)]
    (run_dir / "records").mkdir(parents=True)
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            futures = [
                pool.submit(generate, run_dir, ranks, steps, only=range(a, b), **args)  # type: ignore[arg-type]
                for a, b in zip(cuts, cuts[1:], strict=False)
            ]
            size = sum(f.result() for f in futures)
    else:
        size = generate(run_dir, ranks, steps, only=range(ranks), **args)  # type: ignore[arg-type]
    finish(run_dir)
    done.write_text(json.dumps({"bytes": size, "seconds": time.perf_counter() - t0}))
    return run_dir


# The command people run (`syncdoctor diagnose RUN --json`), in this process: wall and CPU
# from before its imports, its peak RSS, its top finding.
_MEASURE = (
    "import contextlib,io,json,resource,sys,time; t=time.perf_counter();"
    "from syncdoctor.cli.app import main; out=io.StringIO()\n"
    "with contextlib.redirect_stdout(out): main(['diagnose', sys.argv[1], '--json'])\n"
    "d=json.loads(out.getvalue()); f=d['findings'][0] if d['findings'] else None;"
    "u=resource.getrusage(resource.RUSAGE_SELF);"
    "print(json.dumps({'s': time.perf_counter()-t, 'cpu': u.ru_utime+u.ru_stime,"
    "'rss': u.ru_maxrss/2**20,"
    "'top': [f['code'], f['ranks'], f['step'], f['tensor']] if f else None, 'verdict': d['verdict']}))"
)


def measure(run_dir: Path, cache: bool = True, whole: bool = False, timeout: float = 3600) -> dict[str, object]:
    """Diagnose in a fresh process: wall seconds, peak RSS in GiB, top finding.
    ``cache``: whether the reader may read and write its columnar cache; ``whole``:
    read every step record (no bounded model)."""
    env = {**os.environ, "SYNCDOCTOR_RECORDS_CACHE": "1" if cache else "0"}
    if whole:
        env["SYNCDOCTOR_FULL_DETAIL_ROWS"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=timeout,
    )
    data: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def cache_dir(run_dir: Path) -> Path:
    return run_dir / ".syncdoctor" / "cache"


def cache_bytes(run_dir: Path) -> int:
    """The columnar cache on disk: its index and its folder of Parquet parts."""
    return sum(p.stat().st_size for p in cache_dir(run_dir).rglob("*") if p.is_file())


def drop_cache(run_dir: Path) -> None:
    import shutil

    shutil.rmtree(cache_dir(run_dir), ignore_errors=True)


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = a + b x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    return my - b * mx, b


def load() -> str:
    return "load average " + " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--data", type=Path, default=None, help="where the generated runs are kept (default: a temp dir)"
    )
    parser.add_argument("--sizes", default="256x10000", help="RANKSxSTEPS,... measured")
    parser.add_argument("--twin", default="", help="sizes whose healthy twin is measured too")
    parser.add_argument("--whole", default="", help="sizes also diagnosed read whole (they must fit in memory)")
    parser.add_argument("--jobs", type=int, default=2, help="processes writing the records")
    parser.add_argument("--extrapolate", default="4096x100000")
    args = parser.parse_args()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    twins = set(args.twin.split(",")) - {""}
    wholes = set(args.whole.split(",")) - {""}
    tmp = None
    if args.data is None:
        tmp = tempfile.TemporaryDirectory()
        args.data = Path(tmp.name)
    args.data.mkdir(parents=True, exist_ok=True)
    cold_pts: list[tuple[float, float]] = []
    warm_pts: list[tuple[float, float]] = []
    cold_rss: list[tuple[float, float]] = []
    warm_rss: list[tuple[float, float]] = []
    for ranks, steps in sizes:
        name = f"{ranks}x{steps}"
        rank_steps = ranks * steps
        bad, onset = fault(ranks, steps)
        check = -(-onset // CHECK_EVERY) * CHECK_EVERY
        run_dir = ensure(args.data, ranks, steps, twin=False, jobs=args.jobs)
        gen = json.loads((run_dir / ".generated").read_text())
        print(
            f"{ranks:,} ranks × {steps:,} steps = {rank_steps:,} rank-steps: records {gen['bytes'] / 2**30:.1f} GiB "
            f"({gen['bytes'] / rank_steps:.0f} B/rank-step, generated in {gen['seconds']:.0f} s); fault: ranks "
            f"{list(bad)} skip an update at step {onset}, the live check at {check} names {FAULT_TENSOR}",
            flush=True,
        )
        drop_cache(run_dir)
        runs: list[tuple[str, Path, dict[str, bool]]] = [("cold (converts)", run_dir, {}), ("warm", run_dir, {})]
        if name in wholes:
            runs.append(("warm, read whole", run_dir, {"whole": True}))
        if name in twins:
            twin = ensure(args.data, ranks, steps, twin=True, jobs=args.jobs)
            drop_cache(twin)
            runs += [("twin cold", twin, {}), ("twin warm", twin, {})]
        for label, folder, kw in runs:
            before = load()
            r = measure(folder, **kw)
            top = r["top"]
            right = isinstance(top, list) and top[1] == list(bad) and top[2] == onset and top[3] == FAULT_TENSOR
            verdict = "right" if right else ("healthy" if "twin" in label and top is None else "WRONG")
            seconds, rss = float(r["s"]), float(r["rss"])  # type: ignore[arg-type]
            print(
                f"  {label:>17}: {seconds:7.1f} s ({float(r['cpu']):.0f} CPU-s), peak RSS {rss:5.2f} GiB, "  # type: ignore[arg-type]
                f"{seconds / rank_steps * 1e6:6.2f} µs/rank-step; "
                f"top {top} ({verdict}; {r['verdict']}) [{before}]",
                flush=True,
            )
            if folder is run_dir and not kw:
                cold = label.startswith("cold")
                (cold_pts if cold else warm_pts).append((rank_steps, seconds))
                (cold_rss if cold else warm_rss).append((rank_steps, rss))
        size = cache_bytes(run_dir)
        print(f"  columnar cache {size / 2**20:,.0f} MiB ({size / rank_steps:.1f} B/rank-step)", flush=True)
    if len(sizes) > 1 and args.extrapolate:
        ranks, steps = (int(v) for v in args.extrapolate.split("x"))
        x = ranks * steps
        print(f"fitted over {len(sizes)} sizes (a + b × rank-steps), at {ranks:,} × {steps:,} = {x:,} rank-steps:")
        curves = (
            ("cold wall", cold_pts),
            ("warm wall", warm_pts),
            ("cold peak RSS", cold_rss),
            ("warm peak RSS", warm_rss),
        )
        for label, pts in curves:
            a, b = fit(pts)
            unit = "GiB" if "RSS" in label else "s"
            print(f"  {label}: {a:.2f} + {b * 1e6:.4f}e-6 × n {unit} -> {a + b * x:,.1f} {unit}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    os.environ.setdefault("POLARS_MAX_THREADS", "2")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()

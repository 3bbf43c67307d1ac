"""Benchmark: a 5 GB training log streamed through the doctor in <= 1 GiB of memory.

Writes a mixed log of --size bytes (the generator of bench_logparse.py: boring lines,
1% loss lines in four formats, events, keyword noise; streamed block by block, never
held in memory), then runs ingest_logs on it in a child process and reports the
child's wall time and peak RSS (getrusage RUSAGE_CHILDREN ru_maxrss). Exit 1 when the
peak is above --limit. The log is deleted afterwards unless --keep. Refuses to start
when the disk has less than twice --size free.

    .venv/bin/python benchmarks/bench_bigfile.py              # 5G, limit 1 GiB
    .venv/bin/python benchmarks/bench_bigfile.py --size 500M

Timings are noisy on a shared machine; the memory figure is not.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_logparse import _parse_size, generate  # noqa: E402

_CHILD = """
import json, sys, time
from syncdoctor.doctor.ingest import ingest_logs
t0 = time.perf_counter()
data = ingest_logs([sys.argv[1]])
print(json.dumps({"seconds": time.perf_counter() - t0, "loss_rows": data.losses.height,
                  "events": len(data.events), "warnings": data.warnings[:5]}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="5G", help="size of the generated log (default 5G)")
    parser.add_argument("--limit", default="1G", help="peak RSS allowed (default 1G)")
    parser.add_argument("--dir", default=None, help="where to write the log (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the generated log")
    args = parser.parse_args(argv)
    size, limit = _parse_size(args.size), _parse_size(args.limit)

    workdir = Path(tempfile.mkdtemp(prefix="bench_bigfile_", dir=args.dir))
    free = shutil.disk_usage(workdir).free
    if free < 2 * size:
        shutil.rmtree(workdir)
        print(
            f"not enough disk: {free / 2**30:.1f} GiB free in {workdir.parent}, "
            f"need {2 * size / 2**30:.1f} GiB (twice --size); try --dir or a smaller --size"
        )
        return 2
    path = workdir / "big_train.log"
    try:
        t0 = time.perf_counter()
        counts = generate(path, size)
        print(
            f"generated {path.stat().st_size / 1e9:.2f} GB, {counts['lines']:,} lines "
            f"({counts['loss']:,} loss, {counts['event']:,} events) in "
            f"{time.perf_counter() - t0:.0f} s"
        )
        t0 = time.perf_counter()
        child = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if child.returncode != 0:
            print(child.stderr[-3000:])
            return 1
        # Linux reports ru_maxrss in KiB; the only child waited for so far is the ingest.
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        result = json.loads(child.stdout.strip().splitlines()[-1])
        ok = peak <= limit and result["loss_rows"] == counts["loss"]
        print(
            f"ingest_logs: {result['seconds']:.1f} s in the child ({wall:.1f} s with start-up), "
            f"{path.stat().st_size / result['seconds'] / 1e6:.0f} MB/s; peak RSS "
            f"{peak / 2**20:.0f} MiB (limit {limit / 2**20:.0f} MiB); "
            f"{result['loss_rows']:,} loss rows (expected {counts['loss']:,}), "
            f"{result['events']:,} events kept; {'PASS' if ok else 'FAIL'}"
        )
        return 0 if ok else 1
    finally:
        if args.keep:
            print(f"kept {path}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

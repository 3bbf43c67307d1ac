"""Run the mesh lab (train_mesh.py) as a user would: `syncdoctor run -- torchrun`
on 4 processes, no code change, and say what the doctor should find.

    python -m syncdoctor.lab.mesh_runner --style hsdp --fault lr-mismatch --out runs/mesh
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncdoctor.lab.launch import free_port, run_ranks

# fault -> (styles it exists in, the category that names it, the step it acts from or None)
MESH_FAULTS: dict[str, tuple[tuple[str, ...], str, str | None]] = {
    "none": (("hsdp", "tp"), "healthy", None),
    "init-mismatch": (("hsdp", "tp"), "model.init_mismatch", "start"),
    "replica-data": (("hsdp",), "data.sharding", None),
    "lr-mismatch": (("hsdp", "tp"), "optim.state_mismatch", "start"),
    "mode-mismatch": (("hsdp", "tp"), "model.mode_mismatch", "onset"),
    "sp-norm-unreduced": (("tp",), "sync.incomplete_reduce", "onset"),
}
WORLD_SIZE = 4


@dataclass
class MeshRun:
    style: str
    fault: str
    out: Path
    exit_code: int | None
    timed_out: bool
    duration_s: float

    @property
    def expected_category(self) -> str:
        return MESH_FAULTS[self.fault][1]


def run_mesh(
    style: str,
    fault: str,
    out: str | Path,
    *,
    steps: int = 40,
    onset: int = 12,
    seed: int = 0,
    check_every: int = 5,
    timeout_s: float = 900.0,
    pg_timeout_s: float = 60.0,
) -> MeshRun:
    if style not in MESH_FAULTS.get(fault, ((),))[0]:
        raise ValueError(f"fault {fault!r} does not exist in the {style} style")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "syncdoctor.cli",
        "run",
        "--out",
        str(out),
        "--check-every",
        str(check_every),
        "--",
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(WORLD_SIZE),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "syncdoctor.lab.train_mesh",
        "--style",
        style,
        "--fault",
        fault,
        "--steps",
        str(steps),
        "--onset",
        str(onset),
        "--seed",
        str(seed),
        "--pg-timeout",
        str(pg_timeout_s),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    started = time.monotonic()
    codes, timed_out = run_ranks([command], [env], [out.parent / f"{out.name}.console.log"], timeout_s)
    return MeshRun(style, fault, out, codes[0], timed_out, time.monotonic() - started)


def matrix(out_root: Path, seeds: int = 3, steps: int = 40) -> list[dict[str, object]]:
    """Every fault in every style it exists in, and the healthy runs over `seeds` seeds,
    each diagnosed: the mesh's detection matrix."""
    from syncdoctor.doctor.diagnose import diagnose

    cases = [(style, "none", seed) for style in ("hsdp", "tp") for seed in range(seeds)]
    cases += [(style, fault, 0) for fault, (styles, _, _) in MESH_FAULTS.items() if fault != "none" for style in styles]
    rows: list[dict[str, Any]] = []
    for style, fault, seed in cases:
        run = run_mesh(style, fault, out_root / f"{style}-{fault}-s{seed}", steps=steps, seed=seed)
        diag = diagnose([run.out])
        top = diag.findings[0] if diag.findings else None
        found = top.category if top and top.severity != "info" else "healthy"
        correct = diag.verdict == "healthy" if fault == "none" else found == run.expected_category
        rows.append(
            {
                "style": style,
                "fault": fault,
                "seed": seed,
                "verdict": diag.verdict,
                "top": found,
                "rule": top.code if top else None,
                "ranks": top.ranks if top else [],
                "step": top.step if top else None,
                "tensor": top.tensor if top else None,
                "correct": correct,
                "seconds": round(run.duration_s),
            }
        )
        print(" | ".join(str(v) for v in rows[-1].values()), flush=True)
    print(f"{sum(r['correct'] for r in rows)}/{len(rows)} correct")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One mesh-lab run (4 processes on a 2x2 mesh) under syncdoctor run.")
    parser.add_argument("--style", choices=("hsdp", "tp"), default="hsdp", help="sharded data parallelism style")
    parser.add_argument("--fault", choices=sorted(MESH_FAULTS), default="none", help="the fault to inject")
    parser.add_argument("--out", required=True, help="run folder to create (with --matrix: a folder of runs)")
    parser.add_argument("--steps", type=int, default=40, help="training steps (default 40)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run (default 0)")
    parser.add_argument("--matrix", action="store_true", help="run every fault and 3 healthy seeds per style")
    args = parser.parse_args(argv)
    if args.matrix:
        rows = matrix(Path(args.out), steps=args.steps)
        return 0 if all(r["correct"] for r in rows) else 1
    run = run_mesh(args.style, args.fault, args.out, steps=args.steps, seed=args.seed)
    print(
        f"{run.style} {run.fault}: exit {run.exit_code}, {run.duration_s:.0f} s; expect {run.expected_category}; "
        f"next: syncdoctor diagnose {run.out}"
    )
    return 0 if run.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

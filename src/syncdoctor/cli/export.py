"""`syncdoctor export --tensorboard DIR RUN...`: a run's per-rank series for other
tools (the work: syncdoctor.export)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a run's per-rank series for other tools (TensorBoard)",
        description="Read probe records and/or logs, as `diagnose` does, and write every "
        "rank's loss, gradient norms, lr and loss scale as TensorBoard scalars "
        "(one TensorBoard run per rank). Needs tensorboardX: "
        'pip install "syncdoctor[tensorboard]" (from a clone: '
        'pip install -e ".[tensorboard]").',
    )
    p.add_argument("--tensorboard", metavar="DIR", required=True, help="TensorBoard log folder to write")
    p.add_argument("paths", nargs="+", metavar="RUN", help="a probe run folder, log files, or folders of logs")
    p.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from syncdoctor.doctor.diagnose import load_evidence
    from syncdoctor.export import export_tensorboard

    ev = load_evidence(args.paths)
    counts = export_tensorboard(ev, Path(args.tensorboard))
    total = sum(counts.values())
    print(
        f"wrote {total:,} scalars for {len([r for r in counts if r != 'replicas'])} ranks to "
        f"{args.tensorboard}; view: tensorboard --logdir {args.tensorboard}"
    )
    for warning in ev.warnings:
        print(f"warning: {warning}")
    return 0

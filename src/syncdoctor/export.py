"""`syncdoctor export --tensorboard DIR RUN...`: the per-rank series of a run as
TensorBoard scalars, so they can be looked at where people already look.

One TensorBoard run per rank (DIR/rank{R}), so TensorBoard overlays the ranks:
``loss``, ``grad_norm/local`` (the rank's own gradient before the reduction),
``grad_norm/reduced``, ``lr``, ``loss_scale``; and DIR/replicas with
``replicas/parted_ranks`` (how many ranks held other parameters than the majority,
per check). Every recorded step is written, not the report's downsampled series.
Written with tensorboardX (the `tensorboard` extra)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from syncdoctor.errors import InputError

if TYPE_CHECKING:  # the doctor is imported where it is used (cmd_export)
    from syncdoctor.doctor.evidence import Evidence

_STEP_TAGS = (
    ("grad_norm_local", "grad_norm/local"),
    ("grad_norm", "grad_norm/reduced"),
    ("lr", "lr"),
    ("loss_scale", "loss_scale"),
)


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


def export_tensorboard(ev: Evidence, out: Path) -> dict[int | str, int]:
    """Write the evidence's series; returns the number of scalars per rank."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise InputError(
            "the TensorBoard export needs tensorboardX: pip install tensorboardX "
            '(or the extra: pip install -e ".[tensorboard]" in a clone)'
        ) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot write {out}: {exc.strerror}") from exc
    counts: dict[int | str, int] = {}
    frames: list[tuple[str, pl.DataFrame]] = [("loss", ev.losses.select("rank", "step", pl.col("loss").alias("v")))]
    if ev.has_records:
        for column, tag in _STEP_TAGS:
            if column in ev.steps.columns:
                frames.append((tag, ev.steps.select("rank", "step", pl.col(column).cast(pl.Float64).alias("v"))))
    ranks = sorted({int(r) for _, f in frames for r in f["rank"].drop_nulls().unique().to_list()})
    for rank in ranks:
        writer = SummaryWriter(logdir=str(out / f"rank{rank}"), flush_secs=3600)
        n = 0
        try:
            for tag, frame in frames:
                part = frame.filter(
                    (pl.col("rank") == rank) & pl.col("v").is_not_null() & pl.col("step").is_not_null()
                ).sort("step")
                for step, value in zip(part["step"].to_list(), part["v"].to_list(), strict=True):
                    writer.add_scalar(tag, value, int(step))
                    n += 1
        finally:
            writer.close()
        counts[rank] = n
    spans = ev.agreement.timeline
    if spans:
        writer = SummaryWriter(logdir=str(out / "replicas"), flush_secs=3600)
        try:
            n = 0
            for step, parted in ev.agreement.per_check:
                writer.add_scalar("replicas/parted_ranks", len(parted), step)
                n += 1
        finally:
            writer.close()
        counts["replicas"] = n
    return counts

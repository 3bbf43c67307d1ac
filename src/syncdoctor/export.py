"""The per-rank series of a run as TensorBoard scalars, so they can be looked at
where people already look (`syncdoctor export --tensorboard DIR RUN...`, cli/export.py).

One TensorBoard run per rank (DIR/rank{R}), so TensorBoard overlays the ranks:
``loss``, ``grad_norm/local`` (the rank's own gradient before the reduction),
``grad_norm/reduced``, ``lr``, ``loss_scale``; and DIR/replicas with
``replicas/parted_ranks`` (how many ranks held other parameters than the majority,
per check). Every recorded step is written, not the report's downsampled series.
Written with tensorboardX (the `tensorboard` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from syncdoctor.errors import InputError

if TYPE_CHECKING:  # the caller loads the evidence (cli/export.py)
    from syncdoctor.doctor.evidence import Evidence

_STEP_TAGS = (
    ("grad_norm_local", "grad_norm/local"),
    ("grad_norm", "grad_norm/reduced"),
    ("lr", "lr"),
    ("loss_scale", "loss_scale"),
)


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

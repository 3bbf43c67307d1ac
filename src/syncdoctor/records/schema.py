"""Record schema version 1 (docs/records.md)."""

from __future__ import annotations

import polars as pl

from syncdoctor.records.constants import KINDS, RECORDS_SUBDIR, SCHEMA_VERSION, records_path

__all__ = ["KINDS", "RECORDS_SUBDIR", "SCHEMA_VERSION", "STEP_SCHEMA", "RecordError", "records_path"]


class RecordError(Exception):
    """Input that cannot be read as records; the message is one clear line."""


# Explicit dtypes for step records so 2.5M rows parse without inference surprises.
STEP_SCHEMA: dict[str, pl.DataType] = {
    "v": pl.Int64(),
    "kind": pl.String(),
    "rank": pl.Int64(),
    "step": pl.Int64(),
    "micro": pl.Int64(),
    "backward": pl.Int64(),
    "t": pl.Float64(),
    "loss": pl.Float64(),
    "lr": pl.Float64(),
    "grad_norm": pl.Float64(),
    "grad_norm_local": pl.Float64(),
    "reduce_ratio": pl.Float64(),
    "param_fp": pl.Int64(),
    "opt_fp": pl.Int64(),
    "buffer_fp": pl.Int64(),
    "data_fp": pl.Int64(),
    "samples": pl.Int64(),
    "loss_scale": pl.Float64(),
    "overflow": pl.Boolean(),
    "grad_fp16": pl.Boolean(),
    "train_mode": pl.String(),
    "opt_steps": pl.Int64(),
    "grad_fp": pl.Int64(),
    "ids": pl.List(pl.Int64()),
    "tensor_norms": pl.List(pl.Float64()),
    "tensor_fps": pl.List(pl.Int64()),
    # Sharded/hybrid data parallelism: per placement class (probe/mesh.py), the
    # fingerprints of this rank's local shards; compared only within replica groups.
    "replica_fps": pl.Struct({"param": pl.List(pl.Int64()), "opt": pl.List(pl.Int64()),
                              "grad": pl.List(pl.Int64())}),
    # JSON has no NaN/inf: the writer stores such a value as null and names it here.
    "nonfinite": pl.Struct({"loss": pl.String(), "lr": pl.String()}),
}


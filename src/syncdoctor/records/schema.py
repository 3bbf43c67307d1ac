"""Record schema version 1 (docs/records.md)."""

from __future__ import annotations

import polars as pl

from syncdoctor.records import contract
from syncdoctor.records.constants import KINDS, RECORDS_SUBDIR, SCHEMA_VERSION, records_path

__all__ = ["KINDS", "RECORDS_SUBDIR", "SCHEMA_VERSION", "STEP_SCHEMA", "RecordError", "records_path"]


class RecordError(Exception):
    """Input that cannot be read as records; the message is one clear line."""


def _dtype(spec: contract.Field) -> pl.DataType:
    """The polars type of a contract field (records/contract.py)."""
    if spec.type in ("struct", "list[struct]"):
        struct = pl.Struct({f.name: _dtype(f) for f in spec.fields})
        return pl.List(struct) if spec.type == "list[struct]" else struct
    if spec.type.startswith("list["):
        return pl.List(_SCALAR[spec.type[5:-1]])
    return _SCALAR[spec.type]


_SCALAR: dict[str, pl.DataType] = {"int": pl.Int64(), "float": pl.Float64(), "str": pl.String(), "bool": pl.Boolean()}

# Explicit dtypes for step records, derived from the contract, so 2.5M rows parse
# without inference surprises.
STEP_SCHEMA: dict[str, pl.DataType] = {f.name: _dtype(f) for f in contract.STEP}

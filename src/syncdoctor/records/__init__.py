"""The record format shared by the probe (writer) and the doctor (reader).

See docs/records.md for every field. Names are resolved lazily (PEP 562): the
probe runs inside every training process and needs only the writer, not polars.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SCHEMA_VERSION", "STEP_SCHEMA", "RecordError", "RecordWriter", "RunRecords", "read_run"]

_WHERE = {
    "RunRecords": "reader",
    "read_run": "reader",
    "SCHEMA_VERSION": "schema",
    "STEP_SCHEMA": "schema",
    "RecordError": "schema",
    "RecordWriter": "writer",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(name)
    import importlib

    return getattr(importlib.import_module(f"syncdoctor.records.{_WHERE[name]}"), name)

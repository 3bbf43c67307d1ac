"""The record format shared by the probe (writer) and the doctor (reader).

See docs/records.md for every field.
"""

from syncdoctor.records.reader import RunRecords, read_run
from syncdoctor.records.schema import SCHEMA_VERSION, STEP_SCHEMA, RecordError
from syncdoctor.records.writer import RecordWriter

__all__ = ["SCHEMA_VERSION", "STEP_SCHEMA", "RecordError", "RecordWriter", "RunRecords", "read_run"]

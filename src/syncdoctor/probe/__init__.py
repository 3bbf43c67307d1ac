"""The probe: per-rank, per-step records and a live cross-rank check."""

from syncdoctor.probe.check import SyncMismatchError
from syncdoctor.probe.core import NullProbe, Probe, attach

__all__ = ["NullProbe", "Probe", "SyncMismatchError", "attach"]

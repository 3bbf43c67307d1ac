"""The probe: per-rank, per-step records and a live cross-rank check.

Names are resolved lazily (PEP 562) so that `syncdoctor.probe.boot`, which the
generated sitecustomize imports into every process of a `syncdoctor run`, does not
pull in torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NullProbe", "Probe", "SyncMismatchError", "attach"]


def __getattr__(name: str) -> Any:
    if name == "SyncMismatchError":
        # One type for the torch and MindSpore probes.
        from syncdoctor.settings import SyncMismatchError

        return SyncMismatchError
    if name in ("NullProbe", "Probe", "attach"):
        from syncdoctor.probe import core

        return getattr(core, name)
    raise AttributeError(name)

"""The MindSpore adapter: the probe (`probe`, `MindSporeProbe`: callback, AllGather
exchange) and the zero-code attach (`attach`). `syncdoctor.probe.mindspore.MindSporeProbe`
is resolved lazily, so importing this package imports no MindSpore."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("MindSporeProbe", "SyncMismatchError"):
        from syncdoctor.probe.mindspore import probe

        return getattr(probe, name)
    raise AttributeError(name)

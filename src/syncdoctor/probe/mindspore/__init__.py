"""The MindSpore adapter: the probe (`probe`, `MindSporeProbe`: callback, AllGather
exchange), the zero-code attach (`attach`) and what both know between steps (`watch`). `syncdoctor.probe.mindspore.MindSporeProbe`
is resolved lazily, so importing this package imports no MindSpore."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("MindSporeProbe", "SyncDoctorCallback", "SyncMismatchError"):
        from syncdoctor.probe.mindspore import probe

        return getattr(probe, name)
    if name in ("install_autoattach", "install_lazy_autoattach", "report", "skipped"):
        from syncdoctor.probe.mindspore import attach

        return getattr(attach, name)
    raise AttributeError(name)

"""syncdoctor: find why data-parallel training goes wrong only on many cards."""

from __future__ import annotations

from typing import Any

from syncdoctor.version import __version__


def attach(model: Any, optimizer: Any, **kwargs: Any) -> Any:
    """Attach the probe to a torch model and optimizer; see syncdoctor.probe.Probe."""
    from syncdoctor.probe import attach as _attach

    return _attach(model, optimizer, **kwargs)


__all__ = ["__version__", "attach"]

"""Hook points: places in the probe's work where another part may act on the user's
objects, without the probe importing that part.

`syncdoctor experiment` reruns a job with one factor made equal on every rank; inside
each rank that change has to happen at moments only the probe sees (a DDP wrapper about
to be built, a model about to be fingerprinted, an optimizer about to be recorded). The
experiment's in-rank module registers on these points; the probe calls them. A part is
loaded into a rank process by name, from `settings.PLUGINS_ENV`, by the boot.

Each registered function is called as the probe would call its own work: the caller
runs it under its fence (`safety.safe`), and a plugin applies its own policy inside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TORCH_PATCHED = "torch_patched"  # ()                  the zero-code torch patches are in place
BEFORE_DDP = "before_ddp"  # (module)                  DDP is about to wrap `module`
BEFORE_WATCH = "before_watch"  # (module)              the probe is about to fingerprint `module`
BEFORE_SNAPSHOT = "before_snapshot"  # (probe, optimizer)  the probe is about to record `optimizer`
POINTS = (TORCH_PATCHED, BEFORE_DDP, BEFORE_WATCH, BEFORE_SNAPSHOT)

_registered: dict[str, list[Callable[..., Any]]] = {point: [] for point in POINTS}


def register(point: str, fn: Callable[..., Any]) -> None:
    """Call `fn` at `point` from now on (once per registration)."""
    if point not in _registered:
        raise ValueError(f"no hook point {point!r} (known: {', '.join(POINTS)})")
    if fn not in _registered[point]:
        _registered[point].append(fn)


def call(point: str, *args: Any) -> None:
    """Run what is registered at `point`, in registration order (nothing: free)."""
    for fn in _registered[point]:
        fn(*args)

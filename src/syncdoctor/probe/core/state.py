"""What the probe knows in one process, in one typed object (`STATE`), instead of
module-level dicts that other modules read by key.

One process holds one rank (or a launcher, or a helper process that is neither); the
zero-code attach, the probes it makes and the boot all read and write these fields.
Other parts read them through the named attributes, so a rename is a type error, not
a silently missing key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ProcessState:
    # The probes alive in this process, in the order they were made (the same on every
    # rank, so the n-th probe of one rank is compared with the n-th of the others).
    probes: list[Any] = field(default_factory=list)
    installed: bool = False  # the zero-code patches are in place
    stood_down: bool = False  # a patch failed: the patches call the originals only
    early_tried: bool = False  # a probe was tried at the first backward, before any step
    pg_timeout_s: float | None = None  # the job's own collective timeout, once known
    backward_calls: int = 0  # backward() calls in this process, counted before any probe
    pending_losses: list[Any] = field(default_factory=list)  # losses seen before a probe existed
    pending_scale: float | None = None  # a GradScaler's scale read before the first probe
    rank: int | None = None  # the rank this process became (boot: the log tee follows it)


STATE = ProcessState()

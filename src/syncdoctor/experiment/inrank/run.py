"""What the variant does and holds in this rank process (`RUN`), and the helpers every
variant module shares: the fence that marks the variant failed instead of reaching the
program, the once-only patch, a note of what was given up later."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from syncdoctor.probe.core import process, safety

SEED = 20_261_130  # the one constant every rank's random generators start from
AGREE_WAIT_S = 60.0  # the most a rank waits for the others at a point they all reach
AGREE_MARGIN_S = 10.0  # non-zero ranks wait this much longer than rank 0 before giving up
POLL_S = 0.005
STORE_CALL_S = 10.0  # the most one store call may take
MAX_NOTES = 8
VARIANT_MARK = "_syncdoctor_variant"  # on each function a variant put in place (the probe has its own mark)


class Status:
    """What the variant did in this process, written once as the variant event."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applied: bool | None = None
        self.what: list[str] = []
        self.why: list[str] = []
        self.written = False
        self.seed_calls: dict[str, int] = {}
        self.changed: int | None = None  # values this rank had to change (differs by rank, unlike `what`)

    def ok(self, what: str) -> None:
        self.applied = True
        if len(self.what) < MAX_NOTES:
            self.what.append(what)

    def fail(self, why: str) -> None:
        if self.applied is None:
            self.applied = False
        if len(self.why) < MAX_NOTES:
            self.why.append(why)

    def record(self) -> dict[str, Any]:
        if self.name == "seeds" and self.applied:
            self.changed = sum(self.seed_calls.values())
            self.what.append("every later seeding call rewritten alike (" + ", ".join(sorted(self.seed_calls)) + ")")
        if self.applied:
            out: dict[str, Any] = {"name": self.name, "applied": True, "what": "; ".join(self.what)}
            if self.changed is not None:
                out["changed"] = self.changed
            if self.why:  # applied to part of the script: say what was left as it was
                out["why"] = "; ".join(self.why)
            return out
        why = "; ".join(self.why) or NOT_REACHED.get(self.name, "the script never reached the point it acts at")
        return {"name": self.name, "applied": False, "why": why}


_NOT_REACHED = {
    "broadcast": "no model was taken by the probe before the first optimizer step",
    "hparams": "no optimizer was bound before the first optimizer step",
    "data": "no torch DataLoader was built before the first optimizer step (the script feeds its batches another way)",
    "single": "no torch DataLoader was built before the first optimizer step: the batch size could not be scaled",
    "modes": "no grad-enabled forward of a module with trainable parameters before the first optimizer step",
}


NOT_REACHED = {
    "broadcast": "no model was taken by the probe before the first optimizer step",
    "hparams": "no optimizer was bound before the first optimizer step",
    "data": "no torch DataLoader was built before the first optimizer step (the script feeds its batches another way)",
    "single": "no torch DataLoader was built before the first optimizer step: the batch size could not be scaled",
    "modes": "no grad-enabled forward of a module with trainable parameters before the first optimizer step",
}


@dataclass
class VariantRun:
    """This process's variant: its status (None: a plain run) and what its parts keep."""

    status: Status | None = None
    store: Any = None  # the job's c10d store, prefixed, once an agreement needed it
    rounds: dict[str, int] = field(default_factory=dict)  # agreements per topic so far
    broadcast_done: Any = None  # weak set of the modules broadcast already
    loaders: int = 0  # DataLoaders built so far
    hparams: dict[str, Any] | None = None  # the optimizer forced, and what was published
    modes_hook: Any = None  # handles of global hooks that remove themselves
    post_hook: Any = None
    sharded: list[weakref.ref[Any]] = field(default_factory=list)  # loaders the data variant rewrote
    scaled: list[weakref.ref[Any]] = field(default_factory=list)  # loaders the single variant rewrote

    def take(self, name: str) -> Any:
        """A hook handle, once: the attribute is cleared."""
        handle = getattr(self, name)
        setattr(self, name, None)
        return handle


RUN = VariantRun()
LOCAL = threading.local()  # .seeding: inside a rewritten seeding call (its inner calls pass through)


def variant() -> str | None:
    """The variant this process runs under (None: a plain run)."""
    return RUN.status.name if RUN.status is not None else None


def _variant_failed(exc: BaseException) -> None:
    if RUN.status is not None:
        RUN.status.fail(f"{type(exc).__name__}: {exc}"[:300])


# A variant must never change what the program does beyond itself: a failure marks it failed.
safe = safety.guard(on_error=_variant_failed)


def is_helper() -> bool:
    return process.is_helper()


def replace(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    safety.patch_once(owner, name, make, mark=VARIANT_MARK)


def note(why: str) -> None:
    """What a variant gave up after it was applied: in its event when that is still to
    be written (after the first step), and on stderr, where the run's log keeps it."""
    if RUN.status is not None:
        RUN.status.why.append(why)
        print(f"syncdoctor: variant {RUN.status.name}: {why}", file=sys.stderr)

"""The one fence between the probe and the program it watches (framework-free).

Every patch and hook the probe puts into a user's process runs its own work through
`safe`: an exception there never reaches the user's code. What happens next is the
caller's policy (`on_error`): the zero-code patches stand the probe down for the rest
of the run on that rank, an experiment variant marks itself failed. Without a policy
the error is said once on stderr.
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from typing import Any

from syncdoctor.settings import SyncMismatchError


def say(line: str) -> None:
    """One line on stderr; a closed or broken stderr is no reason to fail."""
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:
        pass


def _say_error(exc: BaseException) -> None:
    say(f"syncdoctor: probe error ignored: {type(exc).__name__}: {exc}")


def safe(fn: Callable[..., Any], *args: Any, on_error: Callable[[BaseException], Any] | None = None) -> Any:
    """`fn(*args)`, or None if it raised; `on_error(exc)` is told (and cannot raise either).
    The one exception let through is SyncMismatchError: raised only under
    on_mismatch="raise", where stopping the training is what the user asked for."""
    try:
        return fn(*args)
    except SyncMismatchError:
        raise
    except Exception as exc:  # the probe must never change what the program does
        try:
            (on_error or _say_error)(exc)
        except Exception:
            pass
        return None


def guard(on_error: Callable[[BaseException], Any]) -> Callable[..., Any]:
    """`safe` with one policy bound: each part that patches a user's process makes its
    own fence once (`_safe = guard(on_error=...)`) instead of a wrapper of its own."""

    def fenced(fn: Callable[..., Any], *args: Any) -> Any:
        return safe(fn, *args, on_error=on_error)

    return fenced


PROBE_MARK = "_syncdoctor"  # set on every function the probe put in place of an original


def patch_once(
    owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]], mark: str = PROBE_MARK
) -> bool:
    """Replace `owner.name` by `make(original)`, once: a second install (a second import
    hook firing, a module imported twice) finds the stand-in marked and leaves it. The
    stand-in carries the original's name and docstring and `__wrapped__`, so tools that
    look at the function (inspect, pickle by reference, help) see the original. Each
    patching part has its own `mark`: the probe's stand-in and an experiment variant's
    can be stacked on the same attribute. False where there is nothing to patch."""
    original = getattr(owner, name, None) if owner is not None else None
    if original is None or getattr(original, mark, False):
        return False
    stand_in = functools.wraps(original)(make(original))
    setattr(stand_in, mark, True)
    setattr(owner, name, stand_in)
    return True


def stand_down(exc: BaseException, probes: list[Any]) -> None:
    """A zero-code patch failed: each probe of this process stops for the rest of the run
    (`probe.disable` says so once, in its records and on stderr); with none yet, one line."""
    if not probes:
        say(f"syncdoctor: probe off on this process (training goes on unwatched): {type(exc).__name__}: {exc}")
    for probe in probes:
        probe.disable(exc)


def disabled_lines(rank: int, step: int, exc: BaseException) -> tuple[str, str]:
    """(the record event's message, the stderr line) of a probe that stops at `step`."""
    what = f"{type(exc).__name__}: {exc}"[:500]
    return (
        f"probe disabled: {what}; nothing recorded on this rank after step {step}",
        f"syncdoctor: probe disabled on rank {rank} after step {step} (training goes on unwatched): {what}",
    )


def call_for_caller(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`original(*args, **kwargs)` called from a patch that stands in for it: a warning
    `original` attributes to its caller (`stacklevel=2`: a deprecated argument) is shown
    at the line of the patch's caller, the user's, as without the patch, instead of here.
    Only the display moves: `warnings.showwarning` is wrapped for the call, the filters
    are left alone (entering `catch_warnings` would reset every "shown once" registry)."""
    caller = sys._getframe(2)  # 0: this function, 1: the patch, 2: who called the patch
    saved = warnings.showwarning

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if filename == __file__:
            filename, lineno, line = caller.f_code.co_filename, caller.f_lineno, None
        saved(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        return original(*args, **kwargs)
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = saved

"""Hooks that leave nothing on the user's objects.

A user deep-copies a watched module (an EMA teacher, an lr finder), pickles it
(`torch.save(model.module)`), traces or scripts it. Whatever the probe hangs on that
module travels with it: a forward hook that is a bound method of the probe drags the
probe, its DDP wrapper and its memory-mapped record file into the copy or the pickle,
and the user's line fails (issue: the probe is invisible to the user's objects). So:

- Module forward hooks are never registered on the module. `ForwardWatch` files the
  module in this registry (weakly, by identity) and one of torch's global module hooks
  dispatches to it; the global hook exists only while something is watched, so a step
  with nothing watched keeps torch's hook-free call path. A copy of a watched module is
  another object: plain, and not watched.
- Tensor and optimizer hooks (which torch leaves out of copies and pickles) hold the
  probe weakly (`weak_hook`): they keep no wrapper, writer or file alive.
- Every callback runs behind `safety.safe`: an exception the callback did not catch
  itself disables its probe instead of reaching the user's forward, backward or step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from syncdoctor.probe.safety import safe

PreHook = Callable[[Any, tuple[Any, ...]], None]  # (module, args) at forward start
PostHook = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]  # (module, args, kwargs, output)

# id(module) -> (the module, weakly; its callbacks, weakly), one entry per watch
_pre: dict[int, list[tuple[weakref.ref[Any], weakref.WeakMethod[Any]]]] = {}
_post: dict[int, list[tuple[weakref.ref[Any], weakref.WeakMethod[Any]]]] = {}
_global: dict[str, Any] = {"pre": None, "post": None}


def _call(entries: list[tuple[weakref.ref[Any], weakref.WeakMethod[Any]]] | None, module: Any, *args: Any) -> None:
    if not entries:
        return
    for target, method in list(entries):
        callback = method()
        if callback is not None and target() is module:
            _fenced(callback, module, *args)


def _fenced(method: Callable[..., Any], *args: Any) -> Any:
    """The probe's callbacks guard themselves; this is the last fence: what still escapes
    disables the callback's owner (its `disable`), and never reaches torch's caller."""
    return safe(method, *args, on_error=getattr(getattr(method, "__self__", None), "disable", None))


def _dispatch_pre(module: Any, args: tuple[Any, ...]) -> None:
    _call(_pre.get(id(module)), module, args)


def _dispatch_post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    _call(_post.get(id(module)), module, args, kwargs, output)


def _sync_global_hooks() -> None:
    """Torch's global hooks exist exactly while some module is watched."""
    from torch.nn.modules import module as torch_module

    if _pre and _global["pre"] is None:
        _global["pre"] = torch_module.register_module_forward_pre_hook(_dispatch_pre)
    elif not _pre and _global["pre"] is not None:
        _global["pre"].remove()
        _global["pre"] = None
    if _post and _global["post"] is None:
        _global["post"] = torch_module.register_module_forward_hook(_dispatch_post, with_kwargs=True)
    elif not _post and _global["post"] is not None:
        _global["post"].remove()
        _global["post"] = None


class ForwardWatch:
    """Callbacks at the start and the end of one module's forward, registered nowhere on
    the module. `pre` and `post` must be bound methods: the watch holds their owner
    weakly. `remove()` ends the watch (idempotent)."""

    def __init__(self, module: Any, pre: PreHook | None = None, post: PostHook | None = None) -> None:
        self._key = id(module)
        self._entries: list[tuple[dict[int, Any], tuple[weakref.ref[Any], weakref.WeakMethod[Any]]]] = []
        for table, callback in ((_pre, pre), (_post, post)):
            if callback is not None:
                entry = (weakref.ref(module), weakref.WeakMethod(callback))
                table.setdefault(self._key, []).append(entry)
                self._entries.append((table, entry))
        _sync_global_hooks()

    def remove(self) -> None:
        for table, entry in self._entries:
            entries = table.get(self._key, [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                table.pop(self._key, None)
        self._entries = []
        _sync_global_hooks()


class _WeakHook:
    """A hook for a tensor or an optimizer that calls `owner.method(*bound, *args)` while
    the owner lives, and does nothing after."""

    __slots__ = ("_bound", "_method")

    def __init__(self, method: Callable[..., Any], bound: tuple[Any, ...]) -> None:
        self._method = weakref.WeakMethod(method)
        self._bound = bound

    def __call__(self, *args: Any) -> Any:
        method = self._method()
        return None if method is None else _fenced(method, *self._bound, *args)

    def __deepcopy__(self, memo: dict[int, Any]) -> _WeakHook:
        return self  # holds nothing to copy (torch leaves these hooks out of copies anyway)


def weak_hook(method: Callable[..., Any], *bound: Any) -> Callable[..., Any]:
    """A bound method as a hook that keeps its owner (the probe) alive no longer."""
    return _WeakHook(method, bound)

"""Hooks that leave nothing on the user's objects.

A user deep-copies a watched module (an EMA teacher, an lr finder), pickles it
(`torch.save(model.module)`), traces or scripts it. Whatever the probe hangs on that
module travels with it: a forward hook that is a bound method of the probe drags the
probe, its DDP wrapper and its memory-mapped record file into the copy or the pickle,
and the user's line fails (issue: the probe is invisible to the user's objects). So:

- Module forward hooks are never registered on the module. `ForwardWatch` files the
  module in this registry (weakly, by identity). The module a DDP wrapper holds is
  reached through the wrapper's own call of it (`DistributedDataParallel._run_ddp_forward`,
  patched once): no global hook at all, so `torch.compile` sees none (a global hook makes
  it warn on every compiled call and recompile when hooks come and go). Any other module
  is reached through one of torch's global module hooks, which exists only while such a
  module is watched, so a step with nothing watched keeps torch's hook-free call path.
  A copy of a watched module is another object: plain, and not watched.
- Parameters get nothing in their hook dicts: `GradWatch` hooks the parameter's
  gradient accumulator (its autograd node, which the probe holds), before the gradient
  is accumulated and before DDP's reducer hooks on the same node.
- Optimizers get nothing in their hook dicts: `StepWatch` files the optimizer here and
  one global optimizer step hook, registered once, dispatches to it.
- Every callback is held weakly: the hooks keep no probe, wrapper, writer or file alive.
- Every callback runs behind `safety.safe`: an exception the callback did not catch
  itself disables its probe instead of reaching the user's forward, backward or step.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from syncdoctor.probe.core.safety import safe

PreHook = Callable[[Any, tuple[Any, ...]], None]  # (module, args) at forward start
PostHook = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], None]  # (module, args, kwargs, output)

# id(module) -> (the module, weakly; its callbacks, weakly), one entry per watch
Entries = list[tuple[weakref.ref[Any], weakref.WeakMethod[Any]]]
_pre: dict[int, Entries] = {}
_post: dict[int, Entries] = {}
# id(DDP wrapper) -> callbacks for the module it holds, at its call of that module
_ddp_pre: dict[int, Entries] = {}
_ddp_post: dict[int, Entries] = {}
_steps: dict[int, Entries] = {}  # id(optimizer) -> callbacks after its step
_global: dict[str, Any] = {"pre": None, "post": None, "step": None, "ddp": False}


def _call(entries: Entries | None, target: Any, *args: Any) -> None:
    """Each live callback filed for `target` (checked by identity: an id can be reused)."""
    if not entries:
        return
    for ref, method in list(entries):
        callback = method()
        if callback is not None and ref() is target:
            _fenced(callback, *args)


def _fenced(method: Callable[..., Any], *args: Any) -> Any:
    """The probe's callbacks guard themselves; this is the last fence: what still escapes
    disables the callback's owner (its `disable`), and never reaches torch's caller."""
    return safe(method, *args, on_error=getattr(getattr(method, "__self__", None), "disable", None))


def _dispatch_pre(module: Any, args: tuple[Any, ...]) -> None:
    # Inside a graph torch.compile traces: nothing (the probe's work would break the graph).
    if not torch.compiler.is_compiling():
        _call(_pre.get(id(module)), module, module, args)


def _dispatch_post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
    if not torch.compiler.is_compiling():
        _call(_post.get(id(module)), module, module, args, kwargs, output)


def _patch_ddp_forward() -> bool:
    """Once per process: DDP's call of the module it holds runs the watch's callbacks,
    after DDP's forward-start work (buffers broadcast, inputs moved) as a module
    forward-start hook on that module would. False where this torch's DDP has no such
    call (the watch then takes the global hooks)."""
    if _global["ddp"]:
        return True
    from torch.nn.parallel import DistributedDataParallel

    original = getattr(DistributedDataParallel, "_run_ddp_forward", None)
    if original is None:
        return False

    def _run_ddp_forward(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        key = id(self)
        if key not in _ddp_pre and key not in _ddp_post or torch.compiler.is_compiling():
            return original(self, *inputs, **kwargs)
        module = self.module
        _call(_ddp_pre.get(key), self, module, inputs)
        output = original(self, *inputs, **kwargs)
        _call(_ddp_post.get(key), self, module, inputs, kwargs, output)
        return output

    _run_ddp_forward.__wrapped__ = original  # type: ignore[attr-defined]
    DistributedDataParallel._run_ddp_forward = _run_ddp_forward  # type: ignore[method-assign]
    _global["ddp"] = True
    return True


def _dispatch_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _call(_steps.get(id(optimizer)), optimizer, optimizer, args, kwargs)


def prepare_step_dispatch() -> None:
    """Register the global optimizer step hook that `StepWatch` files into, once. Call it
    before registering other global step hooks that may start a watch: torch iterates
    over its global hooks while it calls them, and a hook registered from inside one
    would change that dict under it."""
    if _global["step"] is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _global["step"] = register_optimizer_step_post_hook(_dispatch_step)


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


class _Filed:
    """Callbacks filed in this module's tables under one object; `remove()` takes them
    out (idempotent)."""

    def __init__(self, target: Any, callbacks: list[tuple[dict[int, Entries], Callable[..., Any] | None]]) -> None:
        self._key = id(target)
        self._entries: list[tuple[dict[int, Entries], tuple[weakref.ref[Any], weakref.WeakMethod[Any]]]] = []
        for table, callback in callbacks:
            if callback is not None:
                entry = (weakref.ref(target), weakref.WeakMethod(callback))
                table.setdefault(self._key, []).append(entry)
                self._entries.append((table, entry))

    def remove(self) -> None:
        for table, entry in self._entries:
            entries = table.get(self._key, [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                table.pop(self._key, None)
        self._entries = []


class ForwardWatch(_Filed):
    """Callbacks at the start and the end of one module's forward, registered nowhere on
    the module. `pre` and `post` must be bound methods: the watch holds their owner
    weakly. With `wrapper` (the DDP wrapper that holds `module`), they run at the
    wrapper's call of the module, with no global hook. `remove()` ends the watch."""

    def __init__(
        self, module: Any, pre: PreHook | None = None, post: PostHook | None = None, wrapper: Any = None
    ) -> None:
        if wrapper is not None and getattr(wrapper, "module", None) is module and _patch_ddp_forward():
            super().__init__(wrapper, [(_ddp_pre, pre), (_ddp_post, post)])
        else:
            super().__init__(module, [(_pre, pre), (_post, post)])
            _sync_global_hooks()

    def remove(self) -> None:
        super().remove()
        _sync_global_hooks()


class StepWatch(_Filed):
    """`post(optimizer, args, kwargs)` after each step of one optimizer, registered nowhere
    on the optimizer (a bound method, held weakly). `remove()` ends the watch."""

    def __init__(self, optimizer: Any, post: Callable[[Any, Any, Any], None]) -> None:
        prepare_step_dispatch()
        super().__init__(optimizer, [(_steps, post)])


def grad_accumulator(param: torch.Tensor) -> Any:
    """The autograd node that accumulates `param`'s gradient into `.grad` (torch keeps it
    alive only while someone holds it, as DDP's reducer does)."""
    with torch.enable_grad():
        return param.view_as(param).grad_fn.next_functions[0][0]  # type: ignore[union-attr]


class GradWatch:
    """`callback(*bound, param, incoming)` when a backward delivers `incoming`, this
    backward's gradient for `param`, before torch adds it to `param.grad` and before the
    reducer hooks DDP hangs on the same node run: `.grad` is still this rank's own.
    Nothing lands in the parameter's hook dicts. `remove()` ends the watch."""

    __slots__ = ("_handle", "_node")

    def __init__(self, param: torch.Tensor, callback: Callable[..., Any], *bound: Any) -> None:
        hook = _WeakHook(callback, (*bound, param))
        self._node = grad_accumulator(param)  # held: the parameter links to it weakly

        def prehook(grad_outputs: tuple[torch.Tensor | None, ...]) -> None:
            hook(grad_outputs[0])
            return None  # never replaces the gradient

        self._handle = self._node.register_prehook(prehook)

    def remove(self) -> None:
        self._handle.remove()


class _WeakHook:
    """A hook that calls `owner.method(*bound, *args)` while the owner lives, and does
    nothing after."""

    __slots__ = ("_bound", "_method")

    def __init__(self, method: Callable[..., Any], bound: tuple[Any, ...]) -> None:
        self._method = weakref.WeakMethod(method)
        self._bound = bound

    def __call__(self, *args: Any) -> Any:
        method = self._method()
        return None if method is None else _fenced(method, *self._bound, *args)

    def __deepcopy__(self, memo: dict[int, Any]) -> _WeakHook:
        return self  # holds nothing to copy (torch leaves these hooks out of copies anyway)

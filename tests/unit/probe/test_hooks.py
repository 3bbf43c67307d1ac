"""The probe's hook points leave nothing on the user's objects (probe/torch/hooks.py), and
what they report is what the old per-object hooks reported."""

from __future__ import annotations

import copy
import gc
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.modules import module as torch_module

from syncdoctor.probe.core import safety
from syncdoctor.probe.torch import hooks
from syncdoctor.probe.torch.canary import eager_module


class Seen:
    """An owner of bound-method callbacks, as the probe is."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def on_grad(self, tag: str, param: torch.Tensor, incoming: torch.Tensor | None) -> None:
        before = None if param.grad is None else param.grad.clone()
        self.calls.append((tag, incoming.clone() if incoming is not None else None, before))

    def on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.calls.append(("step", optimizer))

    def on_start(self, module: Any, args: Any) -> None:
        self.calls.append(("start", module, args))

    def on_end(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        self.calls.append(("end", module, args, kwargs))


def test_grad_watch_sees_each_backward_before_accumulation_and_hangs_nothing_on_the_parameter() -> None:
    param = torch.nn.Parameter(torch.ones(3))
    seen = Seen()
    watch = hooks.GradWatch(param, seen.on_grad, "p")
    (param * 2).sum().backward()
    (param * 3).sum().backward()
    assert [(tag, inc.tolist(), None if b is None else b.tolist()) for tag, inc, b in seen.calls] == [
        ("p", [2.0, 2.0, 2.0], None),
        ("p", [3.0, 3.0, 3.0], [2.0, 2.0, 2.0]),
    ]
    assert param.grad is not None and param.grad.tolist() == [5.0, 5.0, 5.0]  # the gradient is never replaced
    assert not param._backward_hooks and not getattr(param, "_post_accumulate_grad_hooks", None)
    copied = copy.deepcopy(param)
    (copied * 4).sum().backward()  # a copy is not watched
    assert len(seen.calls) == 2
    watch.remove()
    (param * 1).sum().backward()
    assert len(seen.calls) == 2


def test_grad_watch_holds_its_owner_weakly() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    seen = Seen()
    hooks.GradWatch(param, seen.on_grad, "p")
    del seen
    gc.collect()
    param.sum().backward()  # the owner is gone: the watch does nothing, and does not fail
    assert param.grad is not None and param.grad.tolist() == [1.0, 1.0]


def test_step_watch_is_called_after_the_watched_optimizers_steps_only_and_hangs_nothing_on_it() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = Seen()
    watch = hooks.StepWatch(optimizer, seen.on_step)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    shadow = copy.deepcopy(optimizer)  # an lr finder's copy: not watched
    shadow.step()
    assert seen.calls == [("step", optimizer)]
    names = [n for n in vars(optimizer) if n.startswith("_optimizer_") and n.endswith("_hooks")]
    assert names and all(not getattr(optimizer, n) for n in names)
    watch.remove()
    optimizer.step()
    assert len(seen.calls) == 1


def test_a_plain_modules_watch_is_a_global_hook_that_exists_only_while_watching() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    seen = Seen()
    before = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    watch = hooks.ForwardWatch(module, pre=seen.on_start, post=seen.on_end)
    x = torch.ones(1, 2)
    module(x)
    copy.deepcopy(module)(x)  # a copy is another object: not watched
    assert [c[0] for c in seen.calls] == ["start", "end"] and seen.calls[0][1] is module
    assert not module._forward_pre_hooks and not module._forward_hooks
    watch.remove()
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == before


@pytest.fixture
def one_rank_group(tmp_path: Any) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_ddp_modules_watch_runs_at_ddps_own_call_of_it_with_no_global_hook(one_rank_group: Any) -> None:
    inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    ddp = torch.nn.parallel.DistributedDataParallel(inner)
    seen = Seen()
    globals_before = len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)
    watch = hooks.ForwardWatch(inner, pre=seen.on_start, post=seen.on_end, wrapper=ddp)
    assert (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks)) == globals_before
    x = torch.ones(3, 2)
    ddp(x)
    assert [c[0] for c in seen.calls] == ["start", "end"]
    assert seen.calls[0][1] is inner and torch.equal(seen.calls[0][2][0], x)
    inner(x)  # called directly, not through the wrapper: not this watch's moment
    assert len(seen.calls) == 2
    watch.remove()
    ddp(x)
    assert len(seen.calls) == 2


def _deprecated(value: int) -> int:
    warnings.warn("value is deprecated", FutureWarning, stacklevel=2)
    return value


def _patched(value: int) -> int:
    return safety.call_for_caller(_deprecated, value)  # as a zero-code patch calls the original


def test_a_warning_about_the_callers_arguments_names_the_users_line_through_a_patch() -> None:
    shown: list[tuple[str, int]] = []
    saved = warnings.showwarning
    warnings.showwarning = lambda m, c, filename, lineno, *rest: shown.append((filename, lineno))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            line = _line_of_next_call()
            assert _patched(3) == 3
    finally:
        warnings.showwarning = saved
    assert shown == [(__file__, line + 1)]


def _line_of_next_call() -> int:
    import inspect

    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_the_canary_of_a_compiled_model_runs_the_model_it_compiled_eagerly() -> None:
    model = torch.nn.Linear(2, 2)
    assert eager_module(model) is model
    assert eager_module(torch.compile(model, backend="eager")) is model


def test_attach_records_the_loss_backward_receives_where_the_script_reports_none(tmp_path: Any) -> None:
    """`syncdoctor.attach` in a loop that never calls probe.loss (a Trainer callback, a
    script adding one line): the scalar given to backward() is the loss of the step, and
    a loss the script reports itself comes first."""
    import syncdoctor
    from syncdoctor.records import read_run

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = syncdoctor.attach(model, optimizer, run_dir=str(tmp_path), check_every=5)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    losses = []
    for step in range(6):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        if step == 5:
            probe.loss(123.0)  # reported: it wins over the backward scalar
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    recorded = read_run(tmp_path).steps.sort("step")["loss"].to_list()
    assert recorded[:5] == pytest.approx(losses[:5], rel=1e-6)
    assert recorded[5] == 123.0

"""What users do to their objects in the middle of training (an EMA teacher, an lr
finder, a whole-module checkpoint, tracing or scripting for export), run at one moment
of a zoo program and written down as outcomes a run without the probe must match:
each operation's exception, or digests of the bytes it produced and of the outputs of
what it made. `--ops-dir DIR` in a zoo program calls `record` at three moments: right
after the wrapper and the optimizer are built, after the first optimizer step, and
right before a check step (the probe's measuring hooks are armed then).

Nothing here touches the live module's forward or its training state: forwards run on
copies, in eval mode, without grad; `load_state_dict` loads the values already there.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

import torch

HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
PARAM_HOOK_DICTS = ("_backward_hooks", "_post_accumulate_grad_hooks")
OPTIMIZER_HOOK_DICTS = (
    "_optimizer_step_pre_hooks",
    "_optimizer_step_post_hooks",
    "_optimizer_state_dict_pre_hooks",
    "_optimizer_state_dict_post_hooks",
    "_optimizer_load_state_dict_pre_hooks",
    "_optimizer_load_state_dict_post_hooks",
)


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _content(obj: Any) -> str:
    """A digest of what a (loaded) state holds: names, dtypes, shapes and the bytes of
    every tensor (a DTensor's local shard), in order, and the repr of everything else."""
    h = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key in value:
                h.update(repr(key).encode())
                walk(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, torch.Tensor):
            local = value.to_local() if hasattr(value, "to_local") else value
            h.update(f"{local.dtype}{tuple(local.shape)}".encode())
            h.update(local.detach().contiguous().numpy().tobytes())
        else:
            h.update(repr(value).encode())

    walk(obj)
    return h.hexdigest()[:16]


def _state_outcome(state: Any) -> str:
    """A saved state's bytes, and the content it loads back to. A DTensor state's bytes
    hold its mesh's per-process hash, different in every process, probe or not: there
    the content alone is compared."""
    data = _saved(state)
    content = _content(_load(data))
    if b"DTensor" in data:
        return f"content={content}"
    return f"bytes={_digest(data)} content={content}"


def _saved(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    return _first_tensor(out[0])


def _hooks(module: torch.nn.Module) -> int:
    """Hooks on the module and every submodule: a plain copy has what the original had
    before any probe came near it."""
    return sum(_sizes(m, HOOK_DICTS) for m in module.modules())


def _sizes(obj: Any, names: tuple[str, ...]) -> int:
    return sum(len(getattr(obj, name, None) or {}) for name in names)


def _dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def _forward(module: Any, example: Any) -> torch.Tensor:
    with torch.no_grad():
        out = module(**example) if isinstance(example, dict) else module(example)
    return _first_tensor(out).detach().contiguous()


def _copy_outcome(made: torch.nn.Module, example: Any) -> str:
    """A module the user made (a copy, a loaded checkpoint): its state, its hooks, and
    its output on the program's fixed input."""
    made.eval()
    out = _forward(made, example)
    return f"state={_content(made.state_dict())} hooks={_hooks(made)} out={_digest(out.numpy().tobytes())}"


def _probe_refs(data: bytes) -> str:
    """A whole-module pickle holds the run's own paths (a Lightning module's hparams, a
    Trainer's output_dir), so its bytes are compared by what must never be in them:
    a reference to the probe, which would make the file unloadable without syncdoctor.
    (Pickled storages also carry per-process keys: their bytes differ run to run.)"""
    return f"probe_refs={data.count(b'syncdoctor.probe')}"


def _load(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _operations(module: torch.nn.Module, wrapper: Any, optimizer: Any, example: Any) -> dict[str, Callable[[], str]]:
    def deepcopy_module() -> str:
        return _copy_outcome(copy.deepcopy(module), example)

    def deepcopy_wrapper_module() -> str:
        inner = getattr(wrapper, "module", None)
        return "no wrapper" if inner is None else _copy_outcome(copy.deepcopy(inner), example)

    def deepcopy_optimizer() -> str:
        return _state_outcome(copy.deepcopy(optimizer).state_dict())

    def save_module() -> str:
        data = _saved(module)
        return f"{_probe_refs(data)} loaded: {_copy_outcome(_load(data), example)}"

    def pickle_module() -> str:
        data = pickle.dumps(module)
        return f"{_probe_refs(data)} loaded: {_copy_outcome(pickle.loads(data), example)}"

    def save_state_dicts() -> str:
        return f"model {_state_outcome(module.state_dict())} optimizer {_state_outcome(optimizer.state_dict())}"

    def pickle_state_dicts() -> str:
        model, state = (pickle.loads(pickle.dumps(s)) for s in (module.state_dict(), optimizer.state_dict()))
        return f"model={_content(model)} optimizer={_content(state)}"

    def load_state_dicts() -> str:
        result = module.load_state_dict(module.state_dict())
        optimizer.load_state_dict(optimizer.state_dict())
        return repr(result)

    def traversals() -> str:
        names = [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]
        kinds = [type(m).__name__ for m in module.modules()]
        return f"{_digest(' '.join(names))} {_digest(' '.join(kinds))} modules={len(kinds)}"

    def repr_text() -> str:
        return _digest(repr(module))

    def fx_trace() -> str:
        return _digest(torch.fx.symbolic_trace(copy.deepcopy(module)).code)

    def jit_script() -> str:
        return _digest(torch.jit.script(copy.deepcopy(module)).code)

    def compile_eager() -> str:
        made = copy.deepcopy(module).eval()
        graphs, breaks = _dynamo_counts()
        out = _digest(_forward(torch.compile(made, backend="eager"), example).numpy().tobytes())
        graphs_now, breaks_now = _dynamo_counts()
        return f"{out} graphs+={graphs_now - graphs} breaks+={breaks_now - breaks}"

    def live_hooks() -> str:
        """What hangs on the live objects themselves (a probe's hook there is seen by the
        user's own hook bookkeeping, and travels with whatever copies those dicts)."""
        on_modules = _hooks(module)
        on_params = sum(_sizes(p, PARAM_HOOK_DICTS) for p in module.parameters())
        on_optimizer = _sizes(optimizer, OPTIMIZER_HOOK_DICTS)
        return f"modules={on_modules} parameters={on_params} optimizer={on_optimizer}"

    return {
        "deepcopy(module)": deepcopy_module,
        "deepcopy(wrapper.module)": deepcopy_wrapper_module,
        "deepcopy(optimizer)": deepcopy_optimizer,
        "torch.save(module)": save_module,
        "pickle(module)": pickle_module,
        "torch.save(state_dicts)": save_state_dicts,
        "pickle(state_dicts)": pickle_state_dicts,
        "load_state_dict": load_state_dicts,
        "named_parameters/modules": traversals,
        "repr(module)": repr_text,
        "torch.fx.symbolic_trace": fx_trace,
        "torch.jit.script": jit_script,
        "torch.compile(eager)": compile_eager,
        "hooks on the live objects": live_hooks,
    }


def _outcome(operation: Callable[[], str]) -> str:
    try:
        return "ok " + operation()
    except Exception as exc:
        message = re.sub(r"0x[0-9a-fA-F]+", "0x…", str(exc).splitlines()[0] if str(exc) else "")
        return f"{type(exc).__name__}: {message[:200]}"


def record(
    out_dir: str | None, rank: int, moment: str, module: Any, wrapper: Any, optimizer: Any, example: Any
) -> None:
    """Run every operation on this rank's objects and add the outcomes under `moment`
    to OUT_DIR/ops{rank}.json (nothing without an out_dir)."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"ops{rank}.json")
    with open(path if os.path.exists(path) else os.devnull) as fh:
        done = json.loads(fh.read() or "{}")
    done[moment] = {name: _outcome(op) for name, op in _operations(module, wrapper, optimizer, example).items()}
    with open(path, "w") as fh:
        json.dump(done, fh, indent=1)


def user_moment(step: int, check_every: int) -> str | None:
    """The moment after optimizer step `step` that `record` runs at, if any: after the
    first step, and right before the first check step after it."""
    return "step1" if step == 1 else "check" if step == check_every - 1 else None

"""The canary forward: one fixed batch through the model on every rank, layer by layer.

Ranks that hold the same parameters, buffers and train/eval modes map the same input
to bitwise the same output at every layer. So at detailed checks the probe builds a
small batch that is identical on every rank by construction (the structure, shapes
and dtypes of the real input seen at the first measured forward, the batch dimension
cut to CANARY_BATCH; float tensors from a generator with a fixed seed, integer
tensors all ones, which is a valid token id, label and attention mask for any model,
bool tensors True), runs it through the inner module (not the DDP wrapper: no
collectives, no buffer broadcast) and records, per module in execution order, an
exact fingerprint and the mean/std of its output. The first layer whose output parts
across ranks names where the model state differs: already the first layer on an
identical input means parameters or modes; nothing parting while the real batches'
statistics do means the data.

It must not change training: it runs under no_grad, inside a forked RNG seeded with a
fixed seed (dropout masks equal across ranks, the training RNG untouched), and every
buffer it could change (BatchNorm running statistics, num_batches_tracked) is copied
before and written back after. Any failure switches it off for the run; the caller
records why once.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator
from typing import Any

import torch
import xxhash

from syncdoctor.probe.torch.fingerprint import device_fingerprint, tensor_fingerprint

CANARY_BATCH = 2  # the batch dimension of the canary input: a forward costs little
CANARY_SEED = 20261130  # the canary input's values and the forward's dropout masks
MAX_LAYERS = 256  # module outputs recorded per canary forward, in execution order
MAX_BUFFER_BYTES = 64 << 20  # buffers copied to be restored: beyond this, no canary
_SIG_CHARS = 200
_PLAIN = (bool, int, float, str, bytes, torch.dtype, torch.device, enum.Enum)


class CanaryUnavailable(Exception):
    """The canary cannot run on this model (the message says why)."""


def build_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any], str]:
    """The canary's (args, kwargs) with the structure of a real forward's, and its
    shape signature (ranks compare canaries only when their signatures match)."""
    generator = torch.Generator().manual_seed(CANARY_SEED)
    sig: list[str] = []
    new_args = tuple(_replace(a, generator, sig) for a in args)
    new_kwargs = {k: _replace(v, generator, sig, k) for k, v in kwargs.items()}
    if not sig:
        raise CanaryUnavailable("the model's input holds no tensor")
    text = ",".join(sig)
    if len(text) > _SIG_CHARS:
        text = text[: _SIG_CHARS - 13] + f"~{xxhash.xxh3_64_intdigest(text.encode()) & 0xFFFFFFFFFFFF:012x}"
    return new_args, new_kwargs, text


def _replace(value: Any, generator: torch.Generator, sig: list[str], name: str = "") -> Any:
    if isinstance(value, torch.Tensor):
        shape = list(value.shape)
        if shape:
            shape[0] = min(shape[0], CANARY_BATCH)
        dtype = value.dtype
        if dtype.is_floating_point or dtype.is_complex:
            made = torch.randn(shape, generator=generator, dtype=torch.float32)
            made = made.to(dtype)
        else:  # integer and bool: ones (True)
            made = torch.ones(shape, dtype=dtype)
        sig.append(f"{name}{'x'.join(map(str, shape))}:{str(dtype).removeprefix('torch.')}")
        return made.to(value.device)
    if isinstance(value, dict):
        return type(value)({k: _replace(v, generator, sig, f"{k}=") for k, v in value.items()})
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_replace(v, generator, sig, name) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, generator, sig, name) for v in value)
    if value is None or isinstance(value, _PLAIN):
        return value  # a flag, a size, a string: as the real call passed it
    # Anything else may carry this rank's real batch inside (a dataclass, a numpy
    # array, a framework's batch object): the canary would not be the same on every rank.
    raise CanaryUnavailable(f"the model's input holds a {type(value).__name__}, which the canary cannot rebuild")


def first_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of a module's output (a tensor, a tuple, a dict, a model output)."""
    if isinstance(output, torch.Tensor):
        return output
    values: Any = output.values() if isinstance(output, dict) else output
    if isinstance(values, (list, tuple)) or isinstance(output, dict):
        for item in values:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def eager_module(module: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile` wrapped, for a compiled one; else `module`."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was compiled
    if dynamo is not None and isinstance(module, dynamo.OptimizedModule):
        return module._orig_mod
    return module


class Canary:
    """The canary of one model: its input is built once, then `run` at detailed checks."""

    def __init__(self, module: torch.nn.Module) -> None:
        # A compiled model's canary runs the module it compiled, eagerly: hooks on a
        # compiled module's layers are traced into its graphs (graph breaks, recompiles,
        # a spent recompile budget: the user's compiled model would change).
        self.module = eager_module(module)
        self.args: tuple[Any, ...] | None = None
        self.kwargs: dict[str, Any] = {}
        self.sig = ""
        self.error: str | None = None  # why the input could not be built
        self.running = False  # the probe's own forward hooks stay out of a canary forward

    @property
    def ready(self) -> bool:
        return self.args is not None

    def build(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Take the canary's input from the first training forward's (once)."""
        if self.args is not None or self.error is not None:
            return
        try:
            self.args, self.kwargs, self.sig = build_input(args, kwargs)
        except Exception as exc:  # reported by run(), at the check, as one event
            self.error = f"{type(exc).__name__}: {exc}"

    def run(self) -> dict[str, Any]:
        """One canary forward; the record's `canary` value."""
        if self.args is None:
            raise CanaryUnavailable(self.error or "no training forward seen at a check step")
        module = self.module
        names = {m: n or type(m).__name__ for n, m in module.named_modules()}
        layers: list[str] = []
        fps: list[Any] = []  # an int (host tensor) or a device scalar, read back together
        stats: list[torch.Tensor] = []

        def hook(mod: torch.nn.Module, args: Any, output: Any) -> None:
            if len(layers) >= MAX_LAYERS:
                return
            out = first_tensor(output)
            if out is None:
                return
            out = out.detach()
            # Now: an in-place op of the next layer (ReLU(inplace=True)) would change it.
            fps.append(tensor_fingerprint(out) if out.device.type == "cpu" else device_fingerprint(out))
            f = out.float() if not out.is_complex() else torch.view_as_real(out).float()
            std = f.std() if f.numel() > 1 else torch.zeros((), device=f.device)
            stats.append(torch.stack([f.mean(), std]))
            layers.append(names.get(mod, type(mod).__name__))

        handles = [m.register_forward_hook(hook) for m in list(module.modules())[: MAX_LAYERS * 4]]
        saved = _save_buffers(module)
        self.running = True
        try:
            with _forked_rng(module), torch.no_grad():
                module(*self.args, **self.kwargs)
        finally:
            self.running = False
            for handle in handles:
                handle.remove()
            with torch.no_grad():
                for buffer, copy in saved:
                    buffer.copy_(copy)
        values: list[Any] = [int(v) if isinstance(v, int) else v for v in fps]  # ints and device tensors
        device_fps = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
        if device_fps:
            read = torch.stack([values[i].to("cpu") for i in device_fps]).tolist()
            for i, v in zip(device_fps, read, strict=True):
                values[i] = int(v)
        pairs = torch.stack([s.to("cpu") for s in stats]).tolist() if stats else []
        return {
            "sig": self.sig,
            "layers": layers,
            "fps": values,
            "mean": [_finite(p[0]) for p in pairs],
            "std": [_finite(p[1]) for p in pairs],
        }


def _finite(x: float) -> float | None:
    return x if x == x and abs(x) != float("inf") else None


def _save_buffers(module: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of every buffer, to be written back: a forward in train mode updates
    BatchNorm's running statistics and counter, and the canary must leave no trace."""
    buffers = [b for b in module.buffers() if b is not None]
    size = sum(b.numel() * b.element_size() for b in buffers)
    if size > MAX_BUFFER_BYTES:
        raise CanaryUnavailable(f"buffers of {size >> 20} MiB: too large to copy and restore")
    return [(b, b.detach().clone()) for b in buffers]


class _forked_rng:  # noqa: N801 - used as a context manager, like torch's
    """The forward's RNG (dropout) seeded alike on every rank; the training RNG of the
    CPU and of the model's accelerators restored afterwards."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.cuda = sorted({p.device.index or 0 for p in _tensors(module) if p.device.type == "cuda"})
        self._fork: Any = None

    def __enter__(self) -> None:
        self._fork = torch.random.fork_rng(devices=self.cuda, device_type="cuda")
        self._fork.__enter__()
        torch.default_generator.manual_seed(CANARY_SEED)
        for index in self.cuda:
            torch.cuda.default_generators[index].manual_seed(CANARY_SEED)

    def __exit__(self, *exc: Any) -> None:
        self._fork.__exit__(*exc)


def _tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()

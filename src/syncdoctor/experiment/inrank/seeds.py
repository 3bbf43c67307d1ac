"""seeds: python `random`, numpy and torch seeded with one constant at start, and every later
seeding call given a value that depends only on the constant, the API and how many calls
of it came before: the same on every rank."""

from __future__ import annotations

import functools
import inspect
import sys
import zlib
from collections.abc import Callable
from typing import Any

from syncdoctor.experiment.inrank.run import LOCAL, RUN, SEED, VARIANT_MARK, is_helper, replace, safe


def _derived(api: str) -> int:
    """The value the next seeding call of `api` gets: the same on every rank."""
    assert RUN.status is not None
    k = RUN.status.seed_calls.get(api, 0)
    RUN.status.seed_calls[api] = k + 1
    return zlib.crc32(f"{SEED}/{api}/{k}".encode()) & 0x7FFFFFFF


def _passes_through() -> bool:
    # A data-loader worker (a helper process) is seeded from its rank's generators,
    # already equal across ranks: its own seeding stays as torch does it.
    return getattr(LOCAL, "seeding", False) or is_helper()


def _seeding(api: str, original: Callable[..., Any], arg: str) -> Callable[..., Any]:
    """`original` with its seed argument `arg` (first positional) replaced."""
    signature = inspect.signature(original) if _has_signature(original) else None

    @functools.wraps(original)
    def seeded(*args: Any, **kwargs: Any) -> Any:
        if _passes_through():
            return original(*args, **kwargs)
        value = _derived(api)
        if args:
            args = (value, *args[1:])
        elif arg in kwargs or signature is None or arg in signature.parameters:
            kwargs[arg] = value
        LOCAL.seeding = True
        try:
            return original(*args, **kwargs)
        finally:
            LOCAL.seeding = False

    seeded._syncdoctor_variant = True  # type: ignore[attr-defined]
    return seeded


def _has_signature(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn)
        return True
    except (TypeError, ValueError):
        return False


def install() -> None:
    import random

    import torch

    assert RUN.status is not None
    random.seed(SEED)
    torch.manual_seed(SEED)
    manual_seed = _seeding("torch.manual_seed", torch.manual_seed, "seed")
    torch.manual_seed = manual_seed
    torch.random.manual_seed = manual_seed

    def torch_seed() -> int:
        if _passes_through():
            return original_seed()
        value = _derived("torch.seed")
        LOCAL.seeding = True
        try:
            original_manual_seed(value)
        finally:
            LOCAL.seeding = False
        return value

    original_seed, original_manual_seed = torch.seed, manual_seed.__wrapped__  # type: ignore[attr-defined]  # functools.wraps
    torch_seed._syncdoctor_variant = True  # type: ignore[attr-defined]
    torch.seed = torch_seed
    torch.random.seed = torch_seed
    replace(torch.cuda, "manual_seed", lambda f: _seeding("torch.cuda.manual_seed", f, "seed"))
    replace(torch.cuda, "manual_seed_all", lambda f: _seeding("torch.cuda.manual_seed_all", f, "seed"))
    replace(random, "seed", lambda f: _seeding("random.seed", f, "a"))
    from torch.utils.data import distributed

    replace(distributed.DistributedSampler, "__init__", _sampler_seed)
    if "numpy" in sys.modules:
        _install_numpy_seeds()
    else:
        from syncdoctor.probe.core import process

        process.when_imported("numpy", lambda: safe(_install_numpy_seeds))
    RUN.status.ok(f"random, numpy and torch seeded with {SEED} at start")


def _sampler_seed(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if not _passes_through():
            bound = signature.bind(self, *args, **kwargs)
            bound.arguments["seed"] = _derived("DistributedSampler.seed")
            args, kwargs = bound.args[1:], bound.kwargs
        original(self, *args, **kwargs)

    __init__._syncdoctor_variant = True  # type: ignore[attr-defined]
    return __init__


def _install_numpy_seeds() -> None:
    import numpy as np

    np.random.seed(SEED % 2**32)
    replace(np.random, "seed", lambda f: _seeding("numpy.random.seed", f, "seed"))

    def make_default_rng(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def default_rng(seed: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(seed, (np.random.Generator, np.random.BitGenerator)) or _passes_through():
                return original(seed, *args, **kwargs)  # an existing generator: no new seed
            return original(_derived("numpy.random.default_rng"), *args, **kwargs)

        default_rng._syncdoctor_variant = True  # type: ignore[attr-defined]
        return default_rng

    replace(np.random, "default_rng", make_default_rng)
    base = np.random.RandomState
    if not getattr(base, VARIANT_MARK, False):

        class RandomState(base):  # type: ignore[misc, valid-type]
            """numpy's RandomState whose seed (None included) is the rank-independent one."""

            _syncdoctor_variant = True

            def __init__(self, seed: Any = None) -> None:
                if not _passes_through():
                    seed = _derived("numpy.random.RandomState")
                super().__init__(seed)

        RandomState.__module__ = base.__module__
        np.random.RandomState = RandomState  # type: ignore[misc]  # numpy's class, replaced on purpose

"""The framework-free part of the start-of-run snapshot, shared by the torch probe
(probe/torch/snapshot.py) and the MindSpore probe (probe/mindspore/probe.py): what must be equal
on every rank before step 1. Each probe passes what only its framework can read
(versions, its RNG and seeds, loss, optimizer, parallel and loader settings); the
rest is read here, once, with the same fixes for both."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from syncdoctor import version
from syncdoctor.settings import rank_env

HYPERPARAM_TYPES = (int, float, str, bool, type(None))


def sha256_file(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def user_source_files() -> dict[str, str]:
    """Hashes of the user's own imported modules: not the standard library, not
    site-packages, not syncdoctor, so that two nodes with different code differ here."""
    skip = tuple(
        p
        for p in {
            sysconfig.get_paths()["stdlib"],
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            sys.prefix,
            sys.base_prefix,
        }
        if p
    )
    own = str(Path(version.__file__).parent)
    files: dict[str, str] = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not path or not path.endswith(".py") or path.startswith(skip) or path.startswith(own):
            continue
        if getattr(module, "__name__", "") == "sitecustomize" and "/.syncdoctor/boot/" in path:
            continue  # the one `syncdoctor run` generated
        digest = sha256_file(path)
        if digest:
            files[os.path.relpath(path)] = digest
    return dict(sorted(files.items()))


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def python_rng_digests() -> dict[str, str]:
    """The RNG states every framework shares: numpy's global one and Python's."""
    out = {"python": digest(repr(random.getstate()).encode())}
    try:
        import numpy as np

        state = np.random.get_state()[1]  # type: ignore[index]  # a tuple for MT19937; else KeyError, caught below
        out["numpy"] = digest(repr(state[:8].tolist()).encode() + state.tobytes())
    except Exception:  # the probe reports; it never fails on a missing piece
        pass
    return out


def public_scalars(obj: Any, internal: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Public scalar attributes a user set on a loss module or a similar object."""
    if obj is None:
        return {}
    items = vars(obj).items() if hasattr(obj, "__dict__") else []
    return {
        k: v
        for k, v in items
        if not k.startswith("_") and k != "training" and k not in internal and isinstance(v, HYPERPARAM_TYPES)
    }


def build_common_snapshot(
    *,
    framework: str,
    rank: int,
    world_size: int,
    versions: dict[str, str],
    rng: dict[str, str],
    seed: dict[str, Any],
    loss_fn: Any,
    loss_params: dict[str, Any],
    optimizer: dict[str, Any],
    ddp: dict[str, Any],
    loader: dict[str, Any],
    global_batch: int | None,
    tensor_names: list[str],
    init_param_fp: int | None,
) -> dict[str, Any]:
    """A snapshot record's fields (records/contract.py SNAPSHOT); the framework hooks
    are the arguments."""
    entry = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return {
        "rank": rank,
        "world_size": world_size,
        "local_rank": int(os.environ.get("LOCAL_RANK", os.environ.get("DEVICE_ID", rank)) or 0),
        "framework": framework,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "t": time.time(),
        "env": rank_env(),
        "versions": {**versions, "syncdoctor": version.__version__},
        "code": {"entry": entry, "entry_sha256": sha256_file(entry) if entry else None, "files": user_source_files()},
        "rng": {**python_rng_digests(), **rng},
        "seed": seed,
        "loss": {"type": type(loss_fn).__name__ if loss_fn is not None else None, "params": loss_params},
        "optimizer": optimizer,
        "ddp": ddp,
        "loader": loader,
        "global_batch": global_batch,
        "tensors": tensor_names,
        "init_param_fp": init_param_fp,
    }

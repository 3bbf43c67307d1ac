"""What users do to their MindSpore objects in the middle of training (a deep copy of
the network, checkpoints saved and loaded, pickling, traversals), at one moment of
user_train.py, written as outcomes a run without the probe must match: each
operation's exception, or digests of what it produced. OPS_DIR=DIR in user_train.py
records them right after the optimizer is built, after the first step and right
before the first check step (the probe's check runs at the step after).

Nothing here changes training: no forward of the live network, and the checkpoint
loaded back into it holds the values it already has.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import pickle
import re
import tempfile
from collections.abc import Callable
from typing import Any

import mindspore as ms


def _digest(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _params(cell: Any, values: bool) -> str:
    """Names, shapes and (values=True) values of every parameter a cell holds."""
    h = hashlib.sha256()
    for name, param in sorted(cell.parameters_and_names(), key=lambda item: item[0]):
        data = param.asnumpy()
        h.update(f"{name}{data.shape}{data.dtype}".encode())
        if values:
            h.update(data.tobytes())
    return h.hexdigest()[:16]


def _checkpoint(cell: Any, values: bool = True) -> str:
    """A checkpoint saved and loaded back: its names, shapes and (values=True) values."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "c.ckpt")
        ms.save_checkpoint(cell, path)
        loaded = ms.load_checkpoint(path)
    held = {
        k: [v.asnumpy().shape, str(v.dtype), _digest(v.asnumpy().tobytes()) if values else None]
        for k, v in sorted(loaded.items())
    }
    return _digest(json.dumps(held, default=str))


def _operations(net: Any, optimizer: Any, values: bool) -> dict[str, Callable[[], str]]:
    def deepcopy_net() -> str:
        return _params(copy.deepcopy(net), values)

    def deepcopy_optimizer() -> str:
        return _params(copy.deepcopy(optimizer), False)

    def save_load_checkpoint() -> str:
        # The optimizer's momentum accumulators differ from run to run here without any
        # probe (two plain runs: abs-sums 28.984 and 28.967 at step 9, the weights equal):
        # its checkpoint is compared by names, shapes and dtypes.
        return f"net={_checkpoint(net, values)} optimizer={_checkpoint(optimizer, values=False)}"

    def load_param_into_net() -> str:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "c.ckpt")
            ms.save_checkpoint(net, path)
            not_loaded = ms.load_param_into_net(net, ms.load_checkpoint(path))
        return repr(not_loaded)

    def pickle_net() -> str:
        return _params(pickle.loads(pickle.dumps(net)), values)

    def traversals() -> str:
        names = [n for n, _ in net.parameters_and_names()] + [n for n, _ in net.cells_and_names()]
        return f"{_digest(' '.join(names))} trainable={len(net.trainable_params())}"

    def repr_text() -> str:
        return _digest(re.sub(r"0x[0-9a-fA-F]+", "0x…", repr(net)))

    return {
        "deepcopy(net)": deepcopy_net,
        "deepcopy(optimizer)": deepcopy_optimizer,
        "save_checkpoint/load_checkpoint": save_load_checkpoint,
        "load_param_into_net": load_param_into_net,
        "pickle(net)": pickle_net,
        "parameters_and_names/cells_and_names": traversals,
        "repr(net)": repr_text,
    }


def _outcome(operation: Callable[[], str]) -> str:
    try:
        return "ok " + operation()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{type(exc).__name__}: {re.sub(r'0x[0-9a-fA-F]+', '0x…', first)[:200]}"


def record(rank: int, moment: str, net: Any, optimizer: Any, values: bool = True) -> None:
    """Add this moment's outcomes to $OPS_DIR/ops{rank}.json (nothing without OPS_DIR).
    values=False: parameters are compared by names, shapes and dtypes only, for a
    training that is not reproducible run to run without any probe."""
    out_dir = os.environ.get("OPS_DIR")
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"ops{rank}.json")
    with open(path if os.path.exists(path) else os.devnull) as fh:
        done = json.loads(fh.read() or "{}")
    done[moment] = {name: _outcome(op) for name, op in _operations(net, optimizer, values).items()}
    with open(path, "w") as fh:
        json.dump(done, fh, indent=1)


def user_moment(step: int, check_every: int) -> str | None:
    """The moment after step `step` that `record` runs at, if any."""
    return "step1" if step == 1 else "check" if step == check_every - 1 else None

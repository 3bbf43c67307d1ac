"""What one MindSpore worker's probe knows between steps (`W`), and the reading of
values off MindSpore objects, shared by the probe (probe.py: the callback, the checks)
and the zero-code attach (attach.py: the patches). Neither of those imports the other's
internals: both read and write this module's state.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from syncdoctor.probe.core.fingerprint import array_fingerprint, combine


def as_numpy(t: Any) -> np.ndarray:
    return t.asnumpy() if hasattr(t, "asnumpy") else np.asarray(t)


def to_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        if isinstance(value, (tuple, list)):  # Model.train with a loss scaler: (loss, overflow, scale)
            value = value[0]
        return float(np.asarray(as_numpy(value), dtype=np.float64).reshape(-1)[0])
    except Exception:
        return None


def scaled_step_outputs(out: Any) -> tuple[bool | None, float | None]:
    """(overflow, loss scale) from what a loss-scaled train step returns, (loss,
    overflow, scale) as TrainOneStepWithLossScaleCell and Model.train give it; (None,
    None) for any other output."""
    if isinstance(out, (tuple, list)) and len(out) >= 3:
        return bool(to_float(out[1])), to_float(out[2])
    return None, None


def find_loss(network: Any) -> Any:
    try:
        from mindspore.nn.loss.loss import LossBase

        for _, cell in network.cells_and_names():
            if isinstance(cell, LossBase):
                return cell
        for attr in ("_loss_fn", "loss_fn"):
            for _, cell in network.cells_and_names():
                if getattr(cell, attr, None) is not None:
                    return getattr(cell, attr)
    except Exception:
        pass
    return None


def global_step(optimizer: Any) -> int | None:
    try:
        return int(optimizer.global_step.asnumpy().reshape(-1)[0])
    except Exception:
        return None


class Watch:
    """What this rank's zero-code probe knows between steps."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_model_train = False
        self.optimizers: list[tuple[weakref.ref[Any], int | None]] = []  # (optimizer, init fingerprint)
        self.cell_opt: dict[int, Any] = {}  # id(cell) -> optimizer it contains (or None)
        self.probe: Any = None
        self.optimizer: Any = None
        self.last_global: int = 0
        self.style: str | None = None
        self.losses: list[Any] = []
        self.iter_counts: dict[int, list[int]] = {}  # id(iterator) -> [batches, samples] since the last step
        self.last_iter: int | None = None
        self.batches_without_step = 0
        self.told_no_step = False
        self.data_fps: list[int] = []
        self.reported: dict[str, Any] = {}
        self.grads_local: Any = None  # at check steps (PyNative): the reducer's input and output
        self.grads: Any = None
        self.loss_cell: Any = None
        self.outer_cells: list[weakref.ref[Any]] = []  # cells Python called at the outermost level
        self.reducer: Any = None  # the reducer seen called (PyNative)
        # Every DistributedGradReducer built in the process: (reducer, its settings, ids of
        # the parameters it was built for). Seen at construction, so a reducer that runs
        # only compiled (GRAPH mode, @ms.jit) is known all the same.
        self.reducers: list[tuple[weakref.ref[Any], dict[str, Any], frozenset[int]]] = []
        self.scaler: Any = None
        self.dataset: Any = None
        self.installed = False
        self.start_failed = False
        self.need_init = False  # an optimizer was built and nothing has run since
        self.model_train_seen = False
        self.stood_down = False  # a patch failed: the patches call the originals only


W = Watch()


def take_batches() -> tuple[int, int | None, int | None]:
    """(micro-steps, samples, data fingerprint) drawn for the step that just ended, from
    the iterator that fed it; the counts start again."""
    micro, samples = 1, None
    if W.last_iter is not None and W.last_iter in W.iter_counts:
        micro, samples = W.iter_counts[W.last_iter]
        micro = max(1, micro)
    data_fp = combine(W.data_fps) if W.data_fps else None
    W.iter_counts, W.data_fps = {}, []
    return micro, samples or None, data_fp


def take_init() -> None:
    """What every rank starts from: the parameters each optimizer updates, fingerprinted
    at the first call into MindSpore after it was built (before any update, after a
    checkpoint the script loaded into the net)."""
    W.need_init = False
    W.optimizers = [
        (ref, fp if fp is not None else combine([array_fingerprint(p.asnumpy()) for p in opt.parameters]))
        for ref, fp in W.optimizers
        if (opt := ref()) is not None
    ]


def reducer_settings(reducer: Any) -> dict[str, Any]:
    """What decides how a DistributedGradReducer reduces: the settings recorded when it
    was built (attach.py), else read off the instance (its `degree` is kept as the
    tensor 1/degree). Empty for anything else (TrainOneStepCell's Identity)."""
    if reducer is None:
        return {}
    for ref, settings, _ in W.reducers:
        if ref() is reducer:
            return dict(settings)
    if not hasattr(reducer, "allreduce_filter"):
        return {}
    out: dict[str, Any] = {"mean": bool(reducer.mean) if reducer.mean is not None else None}
    inverse = to_float(getattr(reducer, "degree", None))
    out["degree"] = int(round(1.0 / inverse)) if inverse else None
    return out


def pick_reducer(optimizer: Any, roots: list[Any]) -> Any:
    """The gradient reducer the step uses: the one seen called, else one inside the
    train cell, else the one built for the optimizer's parameters (the most of them;
    the last built on a tie), else None."""
    if W.reducer is not None and W.reducer() is not None:
        return W.reducer()
    built = [(ref(), ids) for ref, _, ids in W.reducers if ref() is not None]
    if not built:
        return None
    ids_of = {id(r): ids for r, ids in built}
    for root in roots:
        try:
            for _, cell in root.cells_and_names():
                if id(cell) in ids_of:
                    return cell
        except Exception:
            pass
    wanted = {id(p) for p in getattr(optimizer, "parameters", ())} if optimizer is not None else set()
    best, score = None, 0
    for reducer, ids in built:
        overlap = len(ids & wanted)
        if overlap and overlap >= score:
            best, score = reducer, overlap
    return best


# The stages of a data-parallel step the MindSpore probe can watch, in dataflow order
# (the snapshot's `stages`: for each, observed or not, and how or why not).
STAGES = (
    "params_start",
    "data",
    "modes",
    "loss",
    "grads_local",
    "reduce_settings",
    "grads_reduced",
    "loss_scale",
    "optimizer",
    "params",
)


def stages(
    *,
    compiled: str | None,
    data: str | None,
    loss: str | None,
    reducer: dict[str, Any],
    grads_local: bool,
    grads_reduced: bool,
    loss_scale: str | None,
    no_data: str = "no batch came through Python's dataset iterator",
) -> dict[str, dict[str, Any]]:
    """What this rank's probe observes of each stage: {"observed": True, "how": ...},
    {"observed": False, "how": why not}, or {"observed": None, "how": ...} where the
    stage is not in use (no loss scaler). `compiled`: why gradients do not reach
    Python in this style (GRAPH mode, @ms.jit, Model.train's callback), else None.
    `data`/`loss`: how they are read, None where they are not."""

    def seen(how: str) -> dict[str, Any]:
        return {"observed": True, "how": how}

    def unseen(why: str) -> dict[str, Any]:
        return {"observed": False, "how": why}

    no_grads = compiled or "no call of the gradient reducer or the optimizer with gradients reached Python"
    out = {
        "params_start": seen(
            "the parameters the optimizer updates, fingerprinted when it was built (before any update)"
        ),
        "data": seen(data) if data else unseen(no_data),
        "modes": seen("the cells' train flags, at check steps"),
        "loss": seen(loss) if loss else unseen("no scalar output of the step or of a loss cell reached Python"),
        "grads_local": seen("the gradient reducer's input (PyNative), at detailed steps")
        if grads_local
        else unseen(no_grads),
        "reduce_settings": (
            seen(
                f"the DistributedGradReducer built for the optimizer's parameters, read when it was built "
                f"(mean={reducer.get('mean')}, degree={reducer.get('degree')}, group of {reducer.get('group_size')})"
            )
            if reducer
            else unseen(
                "no DistributedGradReducer was built for the optimizer's parameters: a hand-written "
                "all-reduce (or none), whose operation and scale cannot be read"
            )
        ),
        "grads_reduced": seen("the gradients the optimizer was called with (PyNative), at detailed steps")
        if grads_reduced
        else unseen(no_grads),
        "loss_scale": {"observed": True, "how": loss_scale}
        if loss_scale
        else {"observed": None, "how": "no loss scaler in use"},
        "optimizer": seen("hyperparameters and state fingerprinted at check steps"),
        "params": seen("fingerprinted at check steps, compared across ranks live (AllGather)"),
    }
    return {name: out[name] for name in STAGES}

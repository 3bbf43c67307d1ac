"""The record contract: the one definition of every field a probe writes and the
doctor reads (docs/records.md shows it; tests/unit/test_record_contract.py holds both
probes and the reader to it).

Each record kind is a tuple of `Field`s: a name, a type and a one-line meaning. The
reader's polars schema for step records (records/schema.py) and its type checks of
the other kinds (records/reader.py) are derived from here; the writer validates each
record against it when SYNCDOCTOR_VALIDATE_RECORDS=1. Framework-free and
polars-free: the probe imports it inside every training process.

Types: "int", "float" (an int is a float too), "str", "bool", "dict" (open: its keys
are the framework's own), "list", "list[int]", "list[float]", "list[str]", and
"struct" / "section" (a dict whose keys are the listed fields: "struct" is a column
of the step frame, "section" a part of the snapshot). null is always allowed:
optional fields without a value are left out, and an absent field reads as null.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

KIND_SNAPSHOT, KIND_STEP, KIND_CHECK, KIND_EVENT, KIND_END = "snapshot", "step", "check", "event", "end"


TORCH, MINDSPORE = "torch", "mindspore"
BOTH = (TORCH, MINDSPORE)


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    meaning: str
    fields: tuple[Field, ...] = ()  # the keys of a "struct" or "section"
    by: tuple[str, ...] = BOTH  # the probes that write it (the contract test holds them to it)


def _f(name: str, type_: str, meaning: str, *fields: Field, by: tuple[str, ...] = BOTH) -> Field:
    return Field(name, type_, meaning, fields, by)


# "n/m": n of the m modules (cells) in train mode; when mixed, ":" and a hex bitmap of
# which (module order, first module = highest bit). One encoding for both probes.
TRAIN_MODE = re.compile(r"^(\d+)/(\d+)(?::([0-9a-f]+))?$")


def train_mode(modes: list[bool]) -> str:
    """The train_mode value of modules (cells) whose training flags are `modes`."""
    n, m = sum(modes), len(modes)
    if 0 < n < m:
        return f"{n}/{m}:{int(''.join('1' if t else '0' for t in modes), 2):x}"
    return f"{n}/{m}"


_COMMON = (
    _f("v", "int", "schema version (1)"),
    _f("kind", "str", "record kind: snapshot, step, check, event, end"),
    _f("rank", "int", "the rank that wrote the record"),
)

LOADER = (
    _f("type", "str", "class of the loader or dataset pipeline"),
    _f("batch_size", "int", "per-rank batch size"),
    _f("drop_last", "bool", "the last incomplete batch is dropped"),
    _f("sampler", "str", "class of the sampler (MindSpore: the source's, which shuffles and shards)"),
    _f("num_replicas", "int", "shards the dataset is split into (1: every rank reads all of it)"),
    _f("rank", "int", "the shard this rank reads"),
    _f("shuffle", "bool", "the sampler or source shuffles"),
    _f("seed", "int", "the sampler's shuffle seed (MindSpore: taken from the dataset seed when it was built)"),
    _f("epoch", "int", "the sampler's epoch (seeds its shuffle)", by=(TORCH,)),
    _f("dataset_len", "int", "samples in the dataset"),
    _f("pipeline", "list[str]", "MindSpore: the dataset pipeline's operations, outermost first", by=(MINDSPORE,)),
    _f("shuffle_op", "bool", "MindSpore: a shuffle operation is in the pipeline", by=(MINDSPORE,)),
    _f("shuffle_buffer", "int", "MindSpore: its buffer size", by=(MINDSPORE,)),
    _f("error", "str", "the pipeline could not be read: why", by=(MINDSPORE,)),
)

OPTIMIZER = (
    _f("type", "str", "optimizer class"),
    _f("param_groups", "list", "hyperparameters of each parameter group"),
    _f("n_params", "int", "parameters the optimizer updates"),
    _f("state_replicated", "bool", "false under ZeRO: each rank holds its own part of the state", by=(TORCH,)),
)

SNAPSHOT = (
    *_COMMON,
    _f("world_size", "int", "ranks in the job"),
    _f("local_rank", "int", "the rank on its host (LOCAL_RANK, DEVICE_ID)"),
    _f("framework", "str", '"torch" or "mindspore"'),
    _f("host", "str", "host name"),
    _f("pid", "int", "process id"),
    _f("t", "float", "unix time"),
    _f("env", "dict", "every rank/device/launcher variable (settings.RANK_ENV_*)"),
    _f("versions", "dict", "python, framework, cuda, nccl, numpy, syncdoctor versions"),
    _f("code", "dict", "entry script, its sha256, and the user's own imported source files"),
    _f("rng", "dict", "sha256 of each RNG state at attach time"),
    _f("seed", "dict", "seeds that could be read"),
    _f("loss", "dict", "loss module type and its hyperparameters"),
    _f("optimizer", "section", "optimizer settings", *OPTIMIZER),
    _f("ddp", "dict", "data-parallel settings of the framework (broadcast_buffers, gradients_mean, ...)"),
    _f("loader", "section", "sampler/loader settings", *LOADER),
    _f("global_batch", "int", "batch_size x world_size x accumulation"),
    _f("tensors", "list[str]", "parameter names in fingerprint order"),
    _f("init_param_fp", "int", "fingerprint of the parameters before the first update the probe saw"),
    _f("init_param_fp_before_update", "bool", "no update had happened when init_param_fp was taken", by=(TORCH,)),
    _f(
        "init_params_changed",
        "bool",
        "true only: this rank's parameters changed between the wrap (where the probe began watching) and the first update; init_param_fp is the later one",
        by=(TORCH,),
    ),
    _f(
        "segment",
        "int",
        "absent for the first: the record's segment on this rank, one more for each model rebuilt in the process (same parameters, a new wrapper or optimizer; steps go on counting)",
        by=(TORCH,),
    ),
    _f("init_param_fp_local", "int", "this rank's parameters before a start-up broadcast hid them"),
    _f("replica", "dict", "sharded/hybrid data parallelism: classes, keys, data_key, mesh, init_fps", by=(TORCH,)),
    _f("check_every", "int", "the live check's interval K"),
    _f("baseline", "dict", "the single-card recipe the job was tuned on (lr, batch_size)", by=(TORCH,)),
    _f("auto", "bool", "attached without code changes (`syncdoctor run`)"),
    _f(
        "style", "str", "MindSpore: how the training loop was reached (Model.train, a train cell, ...)", by=(MINDSPORE,)
    ),
    _f(
        "stages",
        "dict",
        'MindSpore, zero-code: each stage of the step -> {"observed": true/false/null (not in use), "how": how, or why not}',
        by=(MINDSPORE,),
    ),
)

# Float fields of a step record: a NaN or inf among them is written as null and named in `nonfinite`.
_STEP_FLOATS = ("t", "loss", "lr", "grad_norm", "grad_norm_local", "reduce_ratio", "loss_scale")

STEP = (
    *_COMMON,
    _f("step", "int", "optimizer steps completed on this rank (1-based)"),
    _f("micro", "int", "backward passes since the previous optimizer step (less `discarded` ones)"),
    _f("backward", "int", "backward passes since start"),
    _f("opt_steps", "int", "optimizer updates applied so far"),
    _f("t", "float", "unix time at the end of the step"),
    _f("loss", "float", "this rank's local loss (mean over the micro-steps)"),
    _f("lr", "float", "first param group's learning rate"),
    _f("grad_norm", "float", "global L2 norm of the gradients the optimizer used (post-reduce)"),
    _f("grad_norm_local", "float", "L2 norm of this rank's own gradients before the reduction"),
    _f("reduce_ratio", "float", "grad_norm / grad_norm_local"),
    _f("param_fp", "int", "fingerprint of all parameters after the step (check steps)"),
    _f("opt_fp", "int", "fingerprint of the optimizer state (detailed steps)"),
    _f("buffer_fp", "int", "fingerprint of the buffers at forward start", by=(TORCH,)),
    _f("grad_fp", "int", "fingerprint of the reduced gradients (detailed steps)"),
    _f(
        "grad_reduced_fp",
        "int",
        "fingerprint of the gradients right after the reduce, before any user code on them: as "
        "the update's last synchronised backward() returned (DDP), or as each gradient's "
        "synchronous dist.all_reduce returned (a hand-written loop) (detailed steps)",
        by=(TORCH,),
    ),
    _f(
        "grad_writes",
        "int",
        "in-place writes into the gradients (a replaced gradient counts one) between the update's "
        "last synchronised backward() and the update: clipping, unscaling (check steps, DDP)",
        by=(TORCH,),
    ),
    _f("data_fp", "int", "fingerprint of this step's sample ids or input bytes"),
    _f("samples", "int", "samples consumed this step"),
    _f("ids", "list[int]", "the reported sample ids, up to MAX_IDS"),
    _f("loss_scale", "float", "AMP loss scale"),
    _f("overflow", "bool", "inf/nan gradients: the update was skipped"),
    _f("grad_fp16", "bool", "the gradients hold float16 values"),
    _f(
        "uncovered_grads",
        "int",
        "DDP, at checks, absent when none: parameters holding a gradient that the DDP reducer does not average",
        by=(TORCH,),
    ),
    _f("uncovered_first", "str", "the first of them, by name", by=(TORCH,)),
    _f(
        "params_rebound",
        "int",
        "at checks, absent when none (not under FSDP/TP or ZeRO): the module's trainable parameters that are "
        "not the objects the probe watches (assigned after the wrap), plus the times a watched parameter's "
        "storage was replaced since the first check (`p.data = ...`, prune.remove, half())",
        by=(TORCH,),
    ),
    _f("params_rebound_first", "str", "the first such tensor seen, by name", by=(TORCH,)),
    _f(
        "grads_missing",
        "int",
        "at checks, summed over the updates so far: trainable parameters the update read with no gradient",
        by=(TORCH,),
    ),
    _f("grads_missing_first", "str", "the last of them seen, by name; absent when none", by=(TORCH,)),
    _f("grads_missing_fp", "int", "a fingerprint of which they were, update by update; absent when none", by=(TORCH,)),
    _f(
        "syncs",
        "str",
        'DDP, where not one synchronised call: per backward() call since the previous update, "s" where DDP all-reduced, "n" inside no_sync (up to 64)',
        by=(TORCH,),
    ),
    _f(
        "unsynced_updates",
        "int",
        "at checks, so far, absent when none: updates that read unaveraged gradients. DDP: none of "
        "whose backward() calls since the previous update synchronised (all inside no_sync); a "
        "hand-written loop (no DDP wrapper) that reduced the gradients with dist.all_reduce before "
        "an earlier update: no all_reduce of a gradient returned since the previous update",
        by=(TORCH,),
    ),
    _f("unsynced_first", "int", "the step of the first of them", by=(TORCH,)),
    _f(
        "unsynced_how",
        "str",
        'with unsynced_updates: "no_sync" (a DDP wrapper) or "no_all_reduce" (a hand-written loop)',
        by=(TORCH,),
    ),
    _f(
        "discarded",
        "int",
        "so far, absent when none: no_sync backward passes whose gradients were set to None before any update read them (not counted in micro or backward)",
        by=(TORCH,),
    ),
    _f(
        "param_writes",
        "int",
        "unsharded, at checks: in-place writes into the parameters so far (the sum of torch's version counters)",
        by=(TORCH,),
    ),
    _f("train_mode", "str", '"n/m[:hex]" modules in train mode (TRAIN_MODE)'),
    _f("config_fp", "int", "fingerprint of what must be configured alike (loss, optimizer, DDP settings)", by=(TORCH,)),
    _f(
        "tensor_norms",
        "list[float]",
        "per-parameter norms of the reduced gradients (detailed steps, every 5th)",
        by=(TORCH,),
    ),
    _f("tensor_fps", "list[int]", "MindSpore, at check steps: per-parameter fingerprints", by=(MINDSPORE,)),
    _f(
        "replica_fps",
        "struct",
        "sharded jobs: per placement class, fingerprints of local shards",
        _f("param", "list[int]", "parameters"),
        _f("opt", "list[int]", "optimizer state"),
        _f("grad", "list[int]", "gradients"),
        by=(TORCH,),
    ),
    _f(
        "acts",
        "list[struct]",
        "opt-in activation statistics of every k-th block",
        _f("name", "str", "index:class of the block"),
        _f("mean", "float", "mean activation"),
        _f("std", "float", "standard deviation"),
        by=(TORCH,),
    ),
    _f(
        "canary",
        "struct",
        "detailed steps: one fixed batch, identical on every rank, through the model; per module output",
        _f("sig", "str", "shapes and dtypes of the canary input (compare ranks with the same sig)"),
        _f("layers", "list[str]", "module names in execution order (a module's output ends its call)"),
        _f("fps", "list[int]", "exact fingerprint of each module's output"),
        _f("mean", "list[float]", "mean of each module's output"),
        _f("std", "list[float]", "standard deviation of each module's output"),
        by=(TORCH,),
    ),
    _f(
        "nonfinite",
        "struct",
        'the float fields written as null because they were NaN/inf ({"loss": "nan"})',
        *(_f(name, "str", f"{name} was this non-finite value") for name in _STEP_FLOATS),
    ),
)

CHECK = (
    *_COMMON,
    _f("step", "int", "ok: the last step of the block read; otherwise the step of the check"),
    _f("status", "str", '"ok", "mismatch" or "incomplete"'),
    _f("what", "list[str]", "which fingerprints differ: param, opt, grad, buffer, counter, config, mode, data"),
    _f("ranks", "list[int]", "mismatch: ranks outside the majority; incomplete: ranks that did not post"),
    _f("tensor", "str", "first differing parameter (or group of parameters)"),
    _f("detail", "dict", "what was compared, per rank; or why the check is incomplete"),
)

EVENT = (
    *_COMMON,
    _f("t", "float", "unix time"),
    _f("step", "int", "last completed step"),
    _f(
        "event",
        "str",
        "timeout, retry, watchdog, network, crash, oom, mismatch, exception, heal, close_check, rebound, ...",
    ),
    _f("message", "str", "what happened, in words"),
    _f("heal", "dict", 'only with "event": "heal": status, odd, source, check_step, what, id, bytes, ...', by=(TORCH,)),
    _f(
        "variant",
        "dict",
        'only with "event": "variant": name, applied (bool), what (what it changed) or why (why not), changed',
        by=(TORCH,),
    ),
)

# The probe's event at the end of a run whose last steps ran after its last check: they
# were compared once more at close, or the message (starting so) says why not.
CLOSE_CHECK_EVENT = "close_check"
# The event of a probe that took over a rebuilt model's record (snapshot `segment`).
REBOUND_EVENT = "rebound"
# The event of a rank that entered torch's `Join` context (uneven inputs by design: a
# rank out of batches shadows the others' collectives until every rank is done).
JOIN_EVENT = "join"
NOT_COMPARED_AT_CLOSE = "last steps not compared at close: "

END = (
    *_COMMON,
    _f("step", "int", "last completed step"),
    _f("t", "float", "unix time"),
    _f("status", "str", '"ok", "exception" or "signal"'),
    _f("message", "str", "the exception's type and text"),
    _f(
        "pending_syncs",
        "str",
        "DDP, absent when none: the backward() calls after the last update, as `syncs` (where a hang or a crash left the rank)",
        by=(TORCH,),
    ),
)

KINDS: dict[str, tuple[Field, ...]] = {
    KIND_SNAPSHOT: SNAPSHOT,
    KIND_STEP: STEP,
    KIND_CHECK: CHECK,
    KIND_EVENT: EVENT,
    KIND_END: END,
}


def names(kind: str) -> tuple[str, ...]:
    return tuple(f.name for f in KINDS[kind])


def field(kind: str, name: str) -> Field:
    return next(f for f in KINDS[kind] if f.name == name)


_PY: dict[str, type | tuple[type, ...]] = {
    "int": int,
    "float": (int, float),
    "str": str,
    "bool": bool,
    "dict": dict,
    "section": dict,
    "struct": dict,
    "list": list,
}


def int64_or_none(value: int | None) -> int | None:
    """An "int" field (a step, a rank) as the Int64 columns hold it: a number past int64,
    such as the digits of a garbled log line, is junk, not a step, and reads as None."""
    return value if value is None or -(2**63) <= value < 2**63 else None


def python_type(type_: str) -> type | tuple[type, ...]:
    """The top-level Python type of a JSON value of this type."""
    return list if type_.startswith("list") else _PY[type_]


def violations(record: dict[str, Any]) -> list[str]:
    """How `record` breaks the contract (empty: it keeps it)."""
    kind = record.get("kind")
    if kind not in KINDS:
        return [f"unknown record kind {kind!r}"]
    return _check_fields(str(kind), record, KINDS[str(kind)])


def _check_fields(where: str, values: dict[str, Any], fields: tuple[Field, ...]) -> list[str]:
    known = {f.name: f for f in fields}
    out = [f"{where}.{key}: not in the contract" for key in values if key not in known]
    for key, value in values.items():
        spec = known.get(key)
        if spec is None or value is None:
            continue
        if not holds(value, spec.type):
            out.append(f"{where}.{key}: {type(value).__name__} is not {spec.type}")
        elif spec.type in ("section", "struct"):
            out += _check_fields(f"{where}.{key}", value, spec.fields)
        elif spec.type == "list[struct]":
            for item in value:
                out += (
                    _check_fields(f"{where}.{key}[]", item, spec.fields)
                    if isinstance(item, dict)
                    else [f"{where}.{key}[]: {type(item).__name__} is not struct"]
                )
    return out


def holds(value: Any, type_: str) -> bool:
    """Whether a JSON value (not null) is of the contract type `type_`: a list's
    elements too (null among them allowed), a dict's keys not."""
    if isinstance(value, bool) and type_ not in ("bool",):
        return False  # a bool is an int in Python, never in the format
    if type_.startswith("list["):
        if not isinstance(value, list):
            return False
        inner = type_[5:-1]
        return inner == "struct" or all(v is None or holds(v, inner) for v in value)
    return isinstance(value, _PY[type_])

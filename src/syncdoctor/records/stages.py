"""The data-parallel contract as data: what healthy data parallelism keeps equal on
every rank, stage by stage of the training step, in the order the data flows.

A sync fault breaks the contract at one stage, and every stage downstream of it then
differs too: gradients averaged from batches that overlap, parameters updated from
those gradients, the loss of those parameters. So the stage a finding names is where
the cause sits, and "what was equal upstream" is what rules the earlier stages out.
Each rule of the doctor names the stage it tests (`Rule.stage`); each finding carries
it; the report prints it; docs/records.md lists the record fields beside each stage.

Framework-free, like the rest of records/: the probes, the doctor and the docs read it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    key: str
    name: str
    holds: str  # the invariant, on every rank
    fields: tuple[str, ...]  # "kind.field": the record fields that show it (records/contract.py)
    # The MindSpore probe's own names for what it observes (the snapshot's `stages`,
    # read by doctor/coverage.py): each belongs to exactly one stage of the contract.
    parts: tuple[str, ...] = ()


STAGES: tuple[Stage, ...] = (
    Stage(
        "launch",
        "launch and environment",
        "every process is one distinct rank of one world size, on a device of its own, running "
        "the same code and library versions",
        ("snapshot.world_size", "snapshot.host", "snapshot.env", "snapshot.versions", "snapshot.code"),
    ),
    Stage(
        "bindings",
        "live bindings",
        "the model, wrapper and optimizer in use are the ones every rank built, holding the state "
        "every rank loaded alike (a rebuilt wrapper or optimizer starts a new segment of the run)",
        ("snapshot.segment", "snapshot.ddp", "snapshot.optimizer", "step.params_rebound", "step.params_rebound_first"),
    ),
    Stage(
        "init",
        "parameters at start",
        "every replica holds the same weights before its first update (what the wrap broadcast and what was loaded after it)",
        (
            "snapshot.init_param_fp",
            "snapshot.init_params_changed",
            "snapshot.init_param_fp_local",
            "snapshot.rng",
            "snapshot.seed",
        ),
        ("params_start",),
    ),
    Stage(
        "data",
        "data",
        "the ranks read disjoint shards of one order, the same number of batches per epoch",
        ("snapshot.loader", "snapshot.global_batch", "step.data_fp", "step.samples", "step.ids"),
        ("data", "loader_settings"),
    ),
    Stage(
        "forward",
        "forward and loss",
        "the same train/eval modes, the same buffers after DDP's broadcast, the same loss "
        "definition; a fixed canary batch gives the same outputs on every replica",
        ("snapshot.loss", "step.train_mode", "step.buffer_fp", "step.canary", "step.loss", "step.nonfinite"),
        ("modes", "loss"),
    ),
    Stage(
        "loss_scale",
        "loss scaling",
        "one loss scale on every rank (it multiplies the loss before backward and divides the "
        "gradients before the update), the same found-inf and the same skipped updates",
        ("step.loss_scale", "step.overflow"),
        ("loss_scale",),
    ),
    Stage(
        "backward",
        "local gradients",
        "the same parameters receive a gradient on every rank",
        ("step.grads_missing", "step.grads_missing_first", "step.grads_missing_fp", "step.grad_norm_local"),
        ("grads_local",),
    ),
    Stage(
        "reducer",
        "reducer coverage",
        "every parameter that receives a gradient is one the all-reduce covers",
        ("step.uncovered_grads", "step.uncovered_first"),
    ),
    Stage(
        "sync_schedule",
        "collectives and sync schedule",
        "the ranks issue the same collectives at the same micro-steps (no_sync, accumulation "
        "counters), every update follows a synchronised backward, and the ranks run the same "
        "number of micro-steps and updates (or split an update into micro-steps differently "
        "while reading as many samples and making the same synchronised calls, the last one "
        "synchronised)",
        (
            "step.syncs",
            "step.unsynced_updates",
            "step.unsynced_first",
            "step.unsynced_how",
            "step.micro",
            "step.backward",
            "step.opt_steps",
            "step.discarded",
            "end.pending_syncs",
        ),
    ),
    Stage(
        "reduced",
        "gradients right after the all-reduce",
        "the all-reduce averages: every rank holds the same gradient, the mean of the local ones",
        ("snapshot.ddp", "step.grad_reduced_fp"),
        ("reduce_settings", "grads_reduced"),
    ),
    Stage(
        "grads_at_update",
        "gradients at the update",
        "what changes the gradients between the all-reduce and the update (clipping, unscaling, "
        "manual scaling) changes every rank's alike: every rank updates from the same gradient",
        ("step.grad_writes", "step.grad_fp", "step.grad_norm", "step.reduce_ratio", "step.grad_fp16"),
    ),
    Stage(
        "optimizer",
        "optimizer",
        "the same hyperparameters and the same optimizer state on every rank",
        ("snapshot.optimizer", "step.lr", "step.opt_fp", "step.config_fp"),
        ("optimizer",),
    ),
    Stage(
        "params",
        "parameters after the update",
        "the replicas stay bitwise equal after every update",
        ("step.param_fp", "step.tensor_fps", "step.tensor_norms", "step.replica_fps", "step.param_writes"),
        ("params",),
    ),
)

# What a finding may name that is no stage of one step's dataflow: the collectives
# failing as such (a timeout, a closed connection), a rank's process ending, and the
# training as a whole (a divergence every rank shares is no sync fault).
OUTSIDE: dict[str, str] = {
    "comm": "the collectives themselves",
    "process": "a rank's process",
    "training": "the training as a whole, on every rank alike",
}

_ORDER = {stage.key: i for i, stage in enumerate(STAGES)}
_NAMES = {**{stage.key: stage.name for stage in STAGES}, **OUTSIDE}


def order(key: str | None) -> int:
    """A stage's place in the dataflow (earlier: smaller); after every stage for what
    is outside one."""
    return _ORDER.get(key or "", len(STAGES))


def name(key: str | None) -> str | None:
    return _NAMES.get(key or "")


def is_known(key: str) -> bool:
    return key in _NAMES


def stage_of_part(part: str) -> str | None:
    """The contract stage a MindSpore probe's observed part belongs to."""
    return next((stage.key for stage in STAGES if part in stage.parts), None)

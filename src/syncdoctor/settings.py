"""What both probes share and read from the environment: one place for every
`SYNCDOCTOR_*` name, the defaults, the environment recorded in the snapshot and the
exception raised on a mismatch. Framework-free and import-light: the generated
sitecustomize imports it into every process of a `syncdoctor run`."""

from __future__ import annotations

import os

# -- environment variables (set by `syncdoctor run`, or by the user) --------------------
RUN_DIR_ENV = "SYNCDOCTOR_RUN_DIR"
AUTO_ENV = "SYNCDOCTOR_AUTO"  # "1" in processes started by `syncdoctor run`
RANK_PID_ENV = "SYNCDOCTOR_RANK_PID"  # pid of the rank process; children inherit it
CHECK_EVERY_ENV = "SYNCDOCTOR_CHECK_EVERY"
ON_MISMATCH_ENV = "SYNCDOCTOR_ON_MISMATCH"
DISABLE_ENV = "SYNCDOCTOR_DISABLE"
CHECK_TIMEOUT_ENV = "SYNCDOCTOR_CHECK_TIMEOUT"
HEAL_WAIT_ENV = "SYNCDOCTOR_HEAL_WAIT_S"
# "0": no canary forward at detailed checks (probe/torch/canary.py); on by default.
CANARY_ENV = "SYNCDOCTOR_CANARY"
# "1": the record writer checks every record against records/contract.py and writes
# what breaks it to RUN_DIR/records/rank{R}.violations (the contract test sets it).
VALIDATE_RECORDS_ENV = "SYNCDOCTOR_VALIDATE_RECORDS"
# `syncdoctor experiment`: the one factor a rerun changes on every rank (experiment/ sets it,
# experiment/inrank/ applies it). VARIANT_WORLD_ENV: the world size of the run the variant is
# compared with (the single-rank baseline scales its per-rank batch to the same global batch).
VARIANT_ENV = "SYNCDOCTOR_VARIANT"
# Modules the boot of every rank process imports before the probe attaches (comma-separated
# dotted names): parts that act at the probe's hook points (probe/core/hook_points.py) without the
# probe importing them. The experiment names its in-rank module here.
PLUGINS_ENV = "SYNCDOCTOR_PLUGINS"
VARIANT_WORLD_ENV = "SYNCDOCTOR_VARIANT_WORLD"
# The single-rank baseline's learning rate at its first step: the compared run's (a script
# that scales its lr with the world size would otherwise run one card at another recipe).
VARIANT_LR_ENV = "SYNCDOCTOR_VARIANT_LR"
VARIANTS = ("single", "seeds", "broadcast", "hparams", "data", "modes")
# `syncdoctor experiment --steps N`: each rank closes its probe after optimizer step N and
# leaves through SystemExit(0) raised from the step hook. Ranks in lockstep (every step is
# a collective) reach step N together, so none is left waiting in a collective.
STOP_AFTER_ENV = "SYNCDOCTOR_STOP_AFTER"

# -- defaults shared by the torch and the MindSpore probe -------------------------------
# The default K. A check costs ~0.5 ms in the training loop of a 100k-parameter MLP
# here (whatever the model: the parameter bytes are a small part of it), 10 us a step
# at K=50, about half of the every-step record (benchmarks/bench_probe.py).
DEFAULT_CHECK_EVERY = 50
DEFAULT_RUN_DIR = "syncdoctor_run"
ON_MISMATCH_CHOICES = ("warn", "dump", "raise", "heal")

# Variables that decide who a rank is, where it talks, and how the comm library
# behaves: recorded in every snapshot, whatever the framework.
RANK_ENV_PREFIXES = (
    "NCCL_",
    "HCCL_",
    "MS_",
    "ASCEND_",
    "GLOG_",
    "TORCH_",
    "TORCHELASTIC_",
    "GLOO_",
    "OMPI_COMM_WORLD_",
    "PMI_",
    "SLURM_",
    "MASTER_",
    "CUDA_",
    "NVIDIA_VISIBLE",
)
RANK_ENV_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "RANK_ID",
        "RANK_SIZE",
        "DEVICE_ID",
        "RANK_TABLE_FILE",
        "MINDSPORE_HCCL_CONFIG_PATH",
        "OMP_NUM_THREADS",
        "PYTHONHASHSEED",
        "HOSTNAME",
    }
)


def rank_env() -> dict[str, str]:
    """The rank/device/launcher variables of this process (the snapshot's `env`)."""
    return {k: v for k, v in os.environ.items() if k in RANK_ENV_NAMES or k.startswith(RANK_ENV_PREFIXES)}


def check_every_from_env(given: int | None) -> int:
    """The check interval K: the argument, else SYNCDOCTOR_CHECK_EVERY, else the default."""
    return max(1, int(given or os.environ.get(CHECK_EVERY_ENV) or DEFAULT_CHECK_EVERY))


def on_mismatch_from_env(given: str | None) -> str:
    """What a probe does on a mismatch: the argument, else SYNCDOCTOR_ON_MISMATCH, else
    "warn". ValueError names the choices when it is none of them."""
    choice = given or os.environ.get(ON_MISMATCH_ENV) or "warn"
    if choice not in ON_MISMATCH_CHOICES:
        raise ValueError(f"on_mismatch must be one of {', '.join(ON_MISMATCH_CHOICES)}, not {choice!r}")
    return choice


def disabled_by_env() -> bool:
    """SYNCDOCTOR_DISABLE set: no probe attaches, whatever the code asks."""
    return bool(os.environ.get(DISABLE_ENV))


def stop_after_from_env() -> int | None:
    """The step after which this rank stops (STOP_AFTER_ENV), or None: run to the end."""
    text = os.environ.get(STOP_AFTER_ENV, "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


STOPPED_MESSAGE = "stopped after step {step} ({env})"


class SyncMismatchError(RuntimeError):
    """Raised into training only when the user chose on_mismatch='raise' (both probes)."""

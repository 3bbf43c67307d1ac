"""The client zoo's scenarios: which program, which launcher, which bug, and the
answer a careful engineer reading the records would give. The tests and docs/zoo.md
are both read from this table.

Expected ranks: with two ranks and no majority, a difference between the ranks names
both (neither can be called the odd one); a rank the records single out by what it
did (the one in eval mode, the one that skipped updates) is named alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS_DIR = Path(__file__).parent / "programs"
STEPS = 20
CHECK_EVERY = 5


@dataclass(frozen=True)
class Program:
    name: str
    script: str
    launcher: str  # own | torchrun | accelerate
    framework: str


@dataclass(frozen=True)
class Expected:
    verdict: str  # healthy | sync_problem | not_sync_problem | inconclusive
    category: str | None = None
    steps: tuple[int, int] | None = None  # the finding's step lies in [lo, hi]
    ranks: tuple[int, ...] | None = None
    # why the doctor is known to answer otherwise today (the test is xfail then)
    doctor_gap: dict[str, str] = field(default_factory=dict)  # mode ("zero"/"attach"/"*") -> reason


PROGRAMS = {p.name: p for p in (
    Program("lightning", "lightning_digits.py", "own", "PyTorch Lightning 2 (own launcher)"),
    Program("lightning-torchrun", "lightning_digits.py", "torchrun", "PyTorch Lightning 2 (torchrun)"),
    Program("hf-trainer", "hf_trainer_digits.py", "torchrun", "Hugging Face Trainer"),
    Program("accelerate", "accelerate_digits.py", "accelerate", "accelerate (plain loop)"),
    Program("ddp-resnet", "ddp_resnet.py", "torchrun", "hand-written DDP (ResNet)"),
    Program("allreduce", "allreduce_loop.py", "torchrun", "hand-written all-reduce loop"),
)}

HEALTHY = Expected("healthy")
BOTH = (0, 1)
K = CHECK_EVERY

SCENARIOS: dict[tuple[str, str], Expected] = {
    ("lightning", ""): HEALTHY,
    ("lightning", "no_dist_sampler"): Expected("sync_problem", "data.sharding", (1, 1), BOTH),
    ("lightning", "eval_rank0"): Expected("sync_problem", "model.mode_mismatch", (9, 10), (0,)),
    ("lightning", "lr_rank0"): Expected("sync_problem", "optim.state_mismatch", (1, 1), BOTH),
    ("lightning-torchrun", ""): HEALTHY,
    ("lightning-torchrun", "no_dist_sampler"): Expected("sync_problem", "data.sharding", (1, 1), BOTH),
    ("lightning-torchrun", "eval_rank0"): Expected("sync_problem", "model.mode_mismatch", (9, 10), (0,)),
    ("lightning-torchrun", "lr_rank0"): Expected("sync_problem", "optim.state_mismatch", (1, 1), BOTH),
    ("hf-trainer", ""): HEALTHY,
    ("hf-trainer", "label_smoothing_rank1"): Expected("sync_problem", "loss.definition_mismatch", (1, 1), BOTH),
    ("hf-trainer", "own_loader"): Expected("sync_problem", "data.sharding", (1, 1), BOTH),
    ("hf-trainer", "weight_decay_rank0"): Expected("sync_problem", "optim.state_mismatch", (1, 1), BOTH),
    ("accelerate", ""): HEALTHY,
    ("accelerate", "unprepared_loader"): Expected("sync_problem", "data.sharding", (1, 1), BOTH),
    ("accelerate", "lr_main_only"): Expected("sync_problem", "optim.state_mismatch", (11, 15), BOTH),
    ("accelerate", "unprepared_model"): Expected("sync_problem", "sync.incomplete_reduce", (1, 1), BOTH),
    ("ddp-resnet", ""): HEALTHY,
    ("ddp-resnet", "no_sampler"): Expected("sync_problem", "data.sharding", (1, 1), BOTH),
    ("ddp-resnet", "no_broadcast_bn"): Expected("sync_problem", "model.buffer_divergence", (2, 5), BOTH),
    ("ddp-resnet", "eval_rank0"): Expected("sync_problem", "model.mode_mismatch", (8, 10), (0,)),
    ("allreduce", ""): HEALTHY,
    ("allreduce", "sum_grads"): Expected("sync_problem", "sync.reduce_op", (1, 1), BOTH),
    ("allreduce", "rank_seed"): Expected("sync_problem", "model.init_mismatch", (0, 1), BOTH),
    ("allreduce", "skip_spike"): Expected("sync_problem", "sync.step_misalignment", (4, 10), None),
}

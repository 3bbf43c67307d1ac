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
    steps: tuple[int, int] | None = None  # the finding's step lies in [lo, hi]; None: a whole-run fault
    ranks: tuple[int, ...] | None = None
    what: str = ""  # the bug, in a few words
    source: str = ""  # where users report it
    # why the doctor is known to answer otherwise today (the test is xfail then)
    doctor_gap: dict[str, str] = field(default_factory=dict)  # mode ("zero"/"attach"/"*") -> reason


PROGRAMS = {
    p.name: p
    for p in (
        Program("lightning", "lightning_digits.py", "own", "PyTorch Lightning 2 (own launcher)"),
        Program("lightning-torchrun", "lightning_digits.py", "torchrun", "PyTorch Lightning 2 (torchrun)"),
        Program("hf-trainer", "hf_trainer_digits.py", "torchrun", "Hugging Face Trainer"),
        Program("accelerate", "accelerate_digits.py", "accelerate", "accelerate (plain loop)"),
        Program("ddp-resnet", "ddp_resnet.py", "torchrun", "hand-written DDP (ResNet)"),
        Program("allreduce", "allreduce_loop.py", "torchrun", "hand-written all-reduce loop"),
        Program("fsdp2", "fsdp2_digits.py", "torchrun", "FSDP2 fully_shard (1-D mesh)"),
    )
}

HEALTHY = Expected("healthy")
BOTH = (0, 1)
K = CHECK_EVERY

LH = "https://github.com/Lightning-AI/pytorch-lightning"
SCENARIOS: dict[tuple[str, str], Expected] = {
    ("lightning", ""): HEALTHY,
    ("fsdp2", ""): HEALTHY,
    ("lightning", "no_dist_sampler"): Expected(
        "sync_problem",
        "data.sharding",
        None,
        BOTH,
        "`use_distributed_sampler=False`, shuffled loader seeded alike: every rank reads the same batches",
        f"{LH}/issues/8562, {LH}/issues/6423",
    ),
    ("lightning", "eval_rank0"): Expected(
        "sync_problem",
        "model.mode_mismatch",
        (9, 10),
        (0,),
        "a `@rank_zero_only` preview hook calls `self.eval()` after step 8 and never `train()`",
        "https://github.com/shubhamagarwal92/mmd/issues/14",
    ),
    ("lightning", "lr_rank0"): Expected(
        "sync_problem",
        "optim.state_mismatch",
        (1, 1),
        BOTH,
        "a tuned lr applied to the optimizer in a `@rank_zero_only` hook",
        f"{LH}/pull/15304, https://github.com/huggingface/accelerate/issues/94",
    ),
    ("lightning-torchrun", ""): HEALTHY,
    # Its no_dist_sampler and eval_rank0 twins are the Lightning ones under another launcher:
    # what the launcher changes (how the probe reaches the ranks) the healthy run and lr_rank0
    # show, so they were dropped to keep the CI under 20 minutes.
    ("lightning-torchrun", "lr_rank0"): Expected(
        "sync_problem", "optim.state_mismatch", (1, 1), BOTH, "as above, under torchrun", f"{LH}/pull/15304"
    ),
    ("hf-trainer", ""): HEALTHY,
    ("hf-trainer", "label_smoothing_rank1"): Expected(
        "sync_problem",
        "loss.definition_mismatch",
        None,
        BOTH,
        "`label_smoothing_factor` from a per-node setting only rank 1 has (the loss is computed by the Trainer's label smoother)",
        "https://github.com/huggingface/transformers/pull/10338",
    ),
    ("hf-trainer", "own_loader"): Expected(
        "sync_problem",
        "data.sharding",
        None,
        BOTH,
        "`get_train_dataloader` overridden with a plain shuffled DataLoader: the Trainer's sharding is bypassed",
        "https://github.com/coqui-ai/Trainer/issues/144",
    ),
    ("hf-trainer", "weight_decay_rank0"): Expected(
        "sync_problem",
        "optim.state_mismatch",
        (1, 1),
        BOTH,
        "`weight_decay` set in a `local_rank <= 0` branch",
        "https://github.com/huggingface/accelerate/issues/94",
    ),
    ("accelerate", ""): HEALTHY,
    ("accelerate", "unprepared_loader"): Expected(
        "sync_problem",
        "data.sharding",
        None,
        BOTH,
        "the DataLoader left out of `accelerator.prepare`",
        "https://github.com/huggingface/accelerate/issues/3336",
    ),
    ("accelerate", "lr_main_only"): Expected(
        "sync_problem",
        "optim.state_mismatch",
        (11, 15),
        BOTH,
        "a manual lr decay after step 10 under `if accelerator.is_main_process:`",
        "https://github.com/huggingface/accelerate/issues/94",
    ),
    ("accelerate", "unprepared_model"): Expected(
        "sync_problem",
        "sync.incomplete_reduce",
        (1, 1),
        BOTH,
        "the model left out of `accelerator.prepare`: no DDP, gradients never averaged",
        "https://github.com/huggingface/accelerate/issues/2316",
    ),
    ("ddp-resnet", ""): HEALTHY,
    ("ddp-resnet", "no_sampler"): Expected(
        "sync_problem",
        "data.sharding",
        None,
        BOTH,
        "no DistributedSampler (`shuffle=True`, every rank seeded alike)",
        "https://github.com/EleutherAI/oslo/issues/59",
    ),
    ("ddp-resnet", "no_broadcast_bn"): Expected(
        "sync_problem",
        "model.buffer_divergence",
        (2, 5),
        BOTH,
        "`DDP(broadcast_buffers=False)` without SyncBatchNorm",
        "https://github.com/open-mmlab/mmdetection/issues/2539, https://github.com/pytorch/pytorch/issues/13711",
    ),
    ("ddp-resnet", "eval_rank0"): Expected(
        "sync_problem",
        "model.mode_mismatch",
        (8, 10),
        (0,),
        "rank 0 validates after step 7 (`model.eval()`), the loop never calls `model.train()` again",
        "https://github.com/shubhamagarwal92/mmd/issues/14",
    ),
    ("allreduce", ""): HEALTHY,
    ("allreduce", "sum_grads"): Expected(
        "sync_problem",
        "sync.reduce_op",
        None,
        BOTH,
        "`all_reduce(SUM)` without dividing by the world size",
        "https://github.com/spellml/deeplab-voc-2012/issues/3",
    ),
    ("allreduce", "rank_seed"): Expected(
        "sync_problem",
        "model.init_mismatch",
        (0, 1),
        BOTH,
        "`manual_seed(seed + rank)` before building the model, no broadcast",
        "https://github.com/karpathy/nanoGPT/issues/22, https://github.com/bl0/moco/issues/4",
    ),
    ("allreduce", "skip_spike"): Expected(
        "sync_problem",
        "sync.step_misalignment",
        (10, 15),
        (0,),
        "a per-rank loss-spike guard skips `optimizer.step()` on the rank whose loss rose",
        "https://github.com/huggingface/accelerate/issues/94",
    ),
}

# The faulty twins also run attached, with the one line where a user puts it, for one or
# two bugs per way of attaching: what attach changes is how the probe finds the objects
# (a Lightning callback, a TrainerCallback, attach() on accelerate's or a hand-made
# wrapper), not what it compares once attached, and every healthy program runs attached.
# The other twins run zero-code only: with the two Lightning-under-torchrun twins dropped
# (above), the zoo launches 44 runs where it launched 57.
ATTACHED_BUGS = {
    ("lightning", "eval_rank0"),
    ("lightning", "lr_rank0"),
    ("hf-trainer", "label_smoothing_rank1"),
    ("accelerate", "unprepared_model"),
    ("ddp-resnet", "no_broadcast_bn"),
    ("allreduce", "sum_grads"),
    ("allreduce", "rank_seed"),
}


def modes_of(program: str, bug: str) -> tuple[str, ...]:
    """The probed modes a scenario runs in."""
    return ("zero", "attach") if not bug or (program, bug) in ATTACHED_BUGS else ("zero",)

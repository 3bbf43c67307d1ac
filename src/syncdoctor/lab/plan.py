"""What one rank of a lab run does: the knobs the training scripts read.

A fault only ever changes these knobs (lab/faults.py); the training scripts
(lab/train_torch.py, lab/train_mindspore.py) read them top to bottom. Knobs that
take effect at a step use `onset`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RankPlan:
    rank: int
    world_size: int
    steps: int = 150  # optimizer steps
    onset: int = 40  # the step at which step-triggered faults act
    seed: int = 0
    sync: str = (
        "ddp"  # "ddp": DistributedDataParallel; "allreduce": hand-written, MindSpore-like (no broadcast at start)
    )
    batch_size: int = 32  # per rank
    base_lr: float = 0.025  # tuned on one card at batch_size
    lr: float = 0.05  # for the global batch (plans_for scales base_lr linearly); the script scales nothing
    momentum: float = 0.9
    weight_decay: float = 0.0
    # data
    seed_model: bool = True  # False: each rank builds its model from a seed of its own (torch), or none (MindSpore)
    shuffle_seed: int | None = 0  # None: this rank shuffles with fresh entropy
    shard: str = "strided"  # "strided" | "none" (every rank reads it all) | "hash" (file-style, uneven)
    shard_id: int | None = None  # None: its own rank
    shuffle_before_shard: bool = True
    drop_last: bool = True
    # gradient accumulation
    accum_steps: int = 1
    # "" | "no_sync": from extra_micro_at, one more local micro-step in every cycle |
    # "extra_update": at extra_micro_at, one more synced micro-step followed by an update
    extra_micro: str = ""
    extra_micro_at: int = 0
    # reduction
    reduce_op: str = "mean"  # "mean" | "sum"
    drop_rank_at: int | None = None  # from this step the reduction leaves out `dropped_rank`
    dropped_rank: int | None = None
    # optimizer
    skip_step_at: int | None = None
    extra_step_at: int | None = None
    momentum_override_at: int | None = None  # from this step this rank's momentum is `momentum_override`
    momentum_override: float = 0.0
    # loss
    loss: str = "asl"  # asymmetric loss of the playbook, multi-label one-vs-rest
    asl_margin: float = 0.05
    # model state
    train_mode: bool = True  # False: this rank calls model.eval() (dropout off, BN frozen)
    broadcast_buffers: bool = True
    # numerics
    fp16_grads: bool = False  # gradients travel and are checked in float16
    loss_scale: str = "none"  # "none" | "dynamic" (global skip decision) | "dynamic_local" (per-rank decision)
    # process faults
    crash_at: int | None = None  # this rank dies out of memory at this step
    stall_at: int | None = None  # this rank stops answering at this step
    pg_timeout_s: float = 20.0
    # silent hardware corruption: one bit of one float32 value flips on this rank
    bitflip: str = ""  # "" | "param" | "grad" (reduced, after the all-reduce) | "opt" (momentum buffer)
    bitflip_at: int | None = None  # the first step it happens
    bitflip_every: int = 0  # then again every this many steps (0: once)
    bitflip_bit: int = 22  # 0-22 mantissa (22: the value moves by up to half), 23-30 exponent, 31 sign
    bitflip_tensor: str = "conv1.weight"  # every input passes through it
    bitflip_index: int = 0  # which element of the tensor
    extra: dict[str, Any] = field(default_factory=dict)

    def extra_update_now(self, next_step: int) -> bool:
        """The fault: this rank closes an accumulation cycle early, after one synced
        micro-step: one all-reduce and one update more than the other ranks."""
        return self.extra_micro == "extra_update" and next_step == self.extra_micro_at

    def micro_steps(self, next_step: int) -> int:
        """Micro-steps in this rank's accumulation cycle that ends at `next_step`."""
        if self.extra_micro == "no_sync" and next_step >= self.extra_micro_at:
            return self.accum_steps + 1  # the fault: one more local micro-step in every cycle
        return self.accum_steps

    def bitflip_now(self, step: int, target: str) -> bool:
        """Whether `target` ("param", "grad", "opt") of this rank gets its bit flipped at `step`."""
        if self.bitflip != target or self.bitflip_at is None or step < self.bitflip_at:
            return False
        return step == self.bitflip_at or (
            self.bitflip_every > 0 and (step - self.bitflip_at) % self.bitflip_every == 0
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankPlan:
        return cls(**data)

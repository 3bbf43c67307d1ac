"""The fault catalog: every failure mode of the playbook as one small unit.

A fault changes knobs of one or more ranks' RankPlan and nothing else; the training
script stays the same for every fault. `measured` states what the fault was seen to
do in this lab (which invariant breaks, what the loss does), not what the playbook
claims; `category` is the doctor's category that names its root cause.
"""

from __future__ import annotations

from typing import ClassVar

from syncdoctor.lab.plan import RankPlan


class Fault:
    name: ClassVar[str]
    description: ClassVar[str]
    symptom: ClassVar[str]  # the playbook's symptom this stands for
    category: ClassVar[str]  # the doctor category of its root cause
    measured: ClassVar[str] = "not measured yet"
    variants: ClassVar[tuple[str, ...]] = ("",)
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    sync: ClassVar[str | None] = None  # forces the data-parallel mode when set
    ends_in_error: ClassVar[bool] = False  # the run is expected to fail

    @staticmethod
    def bad_rank(world_size: int) -> int:
        return world_size - 1

    def apply(self, plan: RankPlan, variant: str) -> None:
        """Change `plan` (one rank's) to inject the fault."""


class Clean(Fault):
    name = "clean"
    description = "the healthy baseline: seeded, shuffle then shard, drop_last, mean reduction"
    symptom = "smoothly decreasing loss, identical replicas"
    category = "healthy"
    frameworks = ("torch", "mindspore")


class UnseededShuffle(Fault):
    name = "unseeded-shuffle"
    description = "each rank shuffles the whole set with its own unseeded RNG, then shards"
    symptom = "loss jumps in a sawtooth (playbook 4.1); ranks' data overlap and miss samples"
    category = "data.seed"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shuffle_seed = None


class ShuffleAfterShard(Fault):
    name = "shuffle-after-shard"
    description = "the raw set is sharded first and each rank then shuffles its own shard"
    symptom = "shard contents fixed by file order; per-rank data views differ (playbook 4.2)"
    category = "data.sharding"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shuffle_before_shard = False
        plan.shard = "contiguous"
        plan.shuffle_seed = plan.seed + 1000 * (plan.rank + 1)


class ShardOverlap(Fault):
    name = "shard-overlap"
    description = "no sharding: every rank reads the full set in the same order"
    symptom = "a rank's loss looks normal but the global batch holds duplicates (quick-ref row 2)"
    category = "data.sharding"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shard = "none"


class UnevenShards(Fault):
    name = "uneven-shards"
    description = "file-style sharding gives ranks different sample counts and drop_last is off"
    symptom = "ranks run different step counts; collectives pair across steps, the job hangs at the end"
    category = "data.sharding"
    ends_in_error = True
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shard = "hash"
        plan.drop_last = False


class DuplicateRankId(Fault):
    name = "duplicate-rank-id"
    description = "two ranks take the same rank id for sharding (RANK_ID copied between hosts)"
    symptom = "two ranks see identical batches, one shard is never seen (forum table, row 1)"
    category = "config.rank_identity"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.shard_id = plan.rank - 1


class DroppedRank(Fault):
    name = "dropped-rank"
    description = "after a simulated comm timeout and retry, one rank's gradients are left out of the average while it keeps updating alone"
    symptom = "loss jumps after a retry in the comm log, no error (playbook 2.3)"
    category = "sync.incomplete_reduce"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.drop_rank_at = plan.onset
        plan.dropped_rank = self.bad_rank(plan.world_size)


class GradAccumMisaligned(Fault):
    name = "grad-accum-misaligned"
    description = "with accumulation over 4 micro-steps one rank runs one micro-step more"
    symptom = "accumulation counter off by one on one rank (playbook 4.3)"
    category = "sync.step_misalignment"
    variants = ("no_sync", "extra_update")
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.accum_steps = 4
        if plan.rank == self.bad_rank(plan.world_size):
            plan.extra_micro = variant or "no_sync"
            plan.extra_micro_at = plan.onset


class SkippedStep(Fault):
    name = "skipped-step"
    description = "one rank skips optimizer.step() once"
    symptom = "replicas part from one step on, no error"
    category = "sync.step_misalignment"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.skip_step_at = plan.onset


class ExtraStep(Fault):
    name = "extra-step"
    description = "one rank calls optimizer.step() twice once"
    symptom = "replicas part from one step on, no error"
    category = "sync.step_misalignment"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.extra_step_at = plan.onset


class LossHparamMismatch(Fault):
    name = "loss-hparam-mismatch"
    description = "the playbook's asymmetric loss (ASL) with margin 0.05 on half the ranks and 0.1 on the others"
    symptom = "looks like a comm fault: per-rank loss offsets, averaged gradients of different losses (playbook 3.5)"
    category = "loss.definition_mismatch"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank >= plan.world_size // 2:
            plan.asl_margin = 0.1


class GradSum(Fault):
    name = "grad-sum"
    description = "gradients are summed across ranks, not averaged (gradients_mean=False)"
    symptom = "effective learning rate × world size: jumps or divergence (forum table, row 4)"
    category = "sync.reduce_op"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.reduce_op = "sum"


class OptimizerStateMismatch(Fault):
    name = "optimizer-state-mismatch"
    description = "from the onset one rank's optimizer runs with another momentum"
    symptom = "loss curve normal-looking but the model does not converge (quick-ref last row)"
    category = "optim.state_mismatch"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.momentum_override_at = plan.onset
            plan.momentum_override = 0.0


class InitMismatch(Fault):
    name = "init-mismatch"
    description = "replicas start from different weights: no seed and no parameter broadcast"
    symptom = "ranks never agree; loss noisy; accuracy below single-card (forum: 参数初始化不一致)"
    category = "model.init_mismatch"
    sync = "allreduce"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.seed_model = False


class ModeMismatch(Fault):
    name = "mode-mismatch"
    description = "one rank forgot model.train(): dropout off and BatchNorm frozen there"
    symptom = "one rank's loss persistently lower/higher (forum: set_train)"
    category = "model.mode_mismatch"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.train_mode = False


class BufferDivergence(Fault):
    name = "buffer-divergence"
    description = "BatchNorm running statistics are never synchronised (broadcast_buffers=False)"
    symptom = "training loss fine, evaluation differs by rank"
    category = "model.buffer_divergence"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.broadcast_buffers = False


class Fp16Overflow(Fault):
    name = "fp16-overflow"
    description = "gradients in float16 without loss scaling (underflow), or with a dynamic scaler whose skip decision is taken per rank"
    symptom = "overflow flags, loss stalls or replicas part after a local skip (forum: 混合精度)"
    category = "numeric.overflow"
    variants = ("no_scaling", "local_skip")
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.fp16_grads = True
        plan.loss_scale = "dynamic_local" if variant == "local_skip" else "none"


class LrNotScaled(Fault):
    name = "lr-not-scaled"
    description = "the world size grew but the learning rate stayed at the single-card value"
    symptom = "all ranks agree, loss decreases slower than it should (quick-ref row 4)"
    category = "hparam.lr_scaling"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.lr = plan.base_lr


class LrTooHigh(Fault):
    name = "lr-too-high"
    description = "not a sync fault: the learning rate is far too high on every rank"
    symptom = "monotonic divergence that single-card training shows too (playbook 1.1)"
    category = "train.divergence"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.lr = plan.lr * 40


class RankCrash(Fault):
    name = "rank-crash"
    description = "one rank dies out of memory mid-run"
    symptom = "the others fail with connection errors that blame the network (forum: 部分进程异常退出)"
    category = "process.crash"
    ends_in_error = True
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.crash_at = plan.onset


class CommTimeout(Fault):
    name = "comm-timeout"
    description = "one rank stalls past the process-group timeout"
    symptom = "every rank fails with a collective timeout (playbook 3.4)"
    category = "comm.fault"
    ends_in_error = True

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.stall_at = plan.onset


FAULTS: dict[str, Fault] = {
    f.name: f()
    for f in (
        Clean, UnseededShuffle, ShuffleAfterShard, ShardOverlap, UnevenShards, DuplicateRankId,
        DroppedRank, GradAccumMisaligned, SkippedStep, ExtraStep, LossHparamMismatch, GradSum,
        OptimizerStateMismatch, InitMismatch, ModeMismatch, BufferDivergence, Fp16Overflow,
        LrNotScaled, LrTooHigh, RankCrash, CommTimeout,
    )
}


def plans_for(fault_name: str, variant: str, world_size: int, **common: object) -> list[RankPlan]:
    """One RankPlan per rank with the fault applied."""
    fault = FAULTS[fault_name]
    plans = []
    for rank in range(world_size):
        plan = RankPlan(rank=rank, world_size=world_size, **common)  # type: ignore[arg-type]
        plan.lr = plan.base_lr * world_size  # the linear scaling rule for the global batch
        if fault.sync:
            plan.sync = fault.sync
        fault.apply(plan, variant)
        plans.append(plan)
    return plans

"""The fault catalog: every failure mode of the playbook as one small unit.

A fault changes knobs of one or more ranks' RankPlan and nothing else; the training
script stays the same for every fault. `measured` states what the fault was seen to
do in this lab (which invariant breaks, what the loss does), not what the playbook
claims; `category` is the doctor's category that names its root cause.
"""

from __future__ import annotations

from typing import ClassVar

from syncdoctor.errors import InputError, did_you_mean
from syncdoctor.lab.plan import RankPlan

# Why the data faults that only sample ids reveal cannot be shown through Model.train.
_NO_IDS_IN_MODEL_TRAIN = (
    "Model.train feeds every dataset column to the network, so sample ids cannot travel "
    "with the batch: which samples each rank reads, the only trace of this fault, "
    "never reaches a probe"
)


class Fault:
    name: ClassVar[str]
    description: ClassVar[str]
    symptom: ClassVar[str]  # the playbook's symptom this stands for
    category: ClassVar[str]  # the doctor category of its root cause
    measured: ClassVar[str] = "not measured yet"
    variants: ClassVar[tuple[str, ...]] = ("",)
    frameworks: ClassVar[tuple[str, ...]] = ("torch",)
    # Why a framework is missing from `frameworks` (shown by `lab matrix --framework X`).
    not_on: ClassVar[dict[str, str]] = {"mindspore": "not yet measured on MindSpore (the script honours its knobs)"}
    # The variants `lab matrix` (and the doctor tests over it) run; None: all of them.
    matrix_variants: ClassVar[tuple[str, ...] | None] = None
    # MindSpore: the lab's training styles (--style) where the fault cannot be built, and why;
    # variants that exist only there (None: the same as `variants`).
    ms_styles_not_on: ClassVar[dict[str, str]] = {}
    ms_variants: ClassVar[tuple[str, ...] | None] = None
    sync: ClassVar[str | None] = None  # forces the data-parallel mode when set
    ends_in_error: ClassVar[bool] = False  # the run is expected to fail

    @staticmethod
    def bad_rank(world_size: int) -> int:
        return world_size - 1

    def apply(self, plan: RankPlan, variant: str) -> None:
        """Change `plan` (one rank's) to inject the fault."""

    def variants_for(self, framework: str) -> tuple[str, ...]:
        return self.ms_variants if framework == "mindspore" and self.ms_variants is not None else self.variants


class Clean(Fault):
    name = "clean"
    description = "the healthy baseline: seeded, shuffle then shard, drop_last, mean reduction"
    symptom = "smoothly decreasing loss, identical replicas"
    category = "healthy"
    measured = (
        "torch, ws 2: parameters, reduced gradients and optimizer state bitwise identical across ranks at every step (checked with K=1); loss 1.1 → 0.05, held-out accuracy 0.99 in ~7 s"
        "; MindSpore 2.10, ws 2: held-out accuracy 0.97 after 66 steps (0.986 after 154); "
        "parameters and optimizer state bitwise identical at every step; every live check ok "
        "(msrun, PyNative with an ms.jit step)."
        "; MindSpore styles (probe attached zero-code): cell and model healthy over seeds 0-2, every live check ok (lab matrix, 60 steps)."
    )
    frameworks = ("torch", "mindspore")


class UnseededShuffle(Fault):
    name = "unseeded-shuffle"
    description = "each rank shuffles the whole set with its own unseeded RNG, then shards"
    symptom = "loss jumps in a sawtooth (playbook 4.1); ranks' data overlap and miss samples"
    category = "data.seed"
    measured = (
        "torch, ws 2: replicas stay identical (DDP averages); within an epoch the ranks' shards overlap (~half the samples read twice, others never); accuracy 0.97 vs 0.99 clean. The playbook's claim that this alone makes the loss jump in a sawtooth did NOT hold here: the loss still decreases smoothly"
        "; MindSpore 2.10, ws 2: MindSpore's own shuffle is seeded even when nobody seeds it "
        "(dataset seed defaults to 5489; ms.set_seed sets it), so the lab uses the playbook's "
        "hand-written unseeded shuffle before num_shards/shard_id; epoch-1 samples overlap across "
        "ranks, parameters identical, snapshot loader.seed null."
        "; MindSpore cell style: named data.seed (overlapping epoch-1 ids)."
    )
    frameworks = ("torch", "mindspore")
    ms_styles_not_on = {"model": _NO_IDS_IN_MODEL_TRAIN}

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shuffle_seed = None


class ShuffleAfterShard(Fault):
    name = "shuffle-after-shard"
    description = "the raw set is sharded first and each rank then shuffles its own shard"
    symptom = "shard contents fixed by file order; per-rank data views differ (playbook 4.2)"
    category = "data.sharding"
    measured = (
        "torch, ws 2: replicas identical; each rank reads the same fixed half of the file order every epoch; no visible effect on loss or accuracy (0.99) on this data"
        "; MindSpore 2.10, ws 2: contiguous per-rank blocks, then .shuffle() under per-rank "
        "ds.config seeds (1000/2000): shards disjoint but fixed; parameters identical; snapshot "
        "seed.dataset_seed differs across ranks."
        "; MindSpore cell style: named data.sharding."
    )
    frameworks = ("torch", "mindspore")

    ms_styles_not_on = {"model": _NO_IDS_IN_MODEL_TRAIN}

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shuffle_before_shard = False
        plan.shard = "contiguous"
        plan.shuffle_seed = plan.seed + 1000 * (plan.rank + 1)


class ShardOverlap(Fault):
    name = "shard-overlap"
    description = "no sharding: every rank reads the full set in the same order"
    symptom = "a rank's loss looks normal but the global batch holds duplicates (quick-ref row 2)"
    category = "data.sharding"
    measured = "torch, ws 2: every rank consumes identical batches (equal data fingerprints), replicas identical; accuracy 0.99 but an epoch takes N× the steps: N cards do one card's work"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shard = "none"


class UnevenShards(Fault):
    name = "uneven-shards"
    description = "file-style sharding gives ranks different sample counts and drop_last is off"
    symptom = "ranks run different step counts; collectives pair across steps, the job hangs at the end"
    category = "data.sharding"
    measured = (
        "torch, ws 2: shards differ in size, partial last batches differ; the rank with more data makes one all-reduce more and fails with gloo 'Connection closed by peer' when its peer exits"
        "; MindSpore 2.10, ws 2: (drop_remainder=False) 25 vs 21 batches an epoch; rank 1 "
        "finishes and exits 0, rank 0's next AllReduce fails ('Ring ReduceScatter wait receiving "
        "... failed', 'AllReduceCPUKernelMod launch failed'), msrun exits 1. Rank 1's last batch "
        "has 1 sample, which ruins BatchNorm's moving variance: its held-out accuracy is 0.10 "
        "with weights equal to rank 0's."
        "; MindSpore, every style: keep_remainder named data.sharding (partial batches of 28 vs 1 samples). drop_remainder: shards of 796 vs 641 samples give 24 vs 20 whole batches an epoch; the step records look alike (same batch size, the collectives pair across epochs) until the longer rank's last AllReduce fails after the other ended ok: the doctor names process.crash or nothing; only the snapshots' loader.dataset_len tells the shards apart."
    )
    ends_in_error = True
    frameworks = ("torch", "mindspore")
    # MindSpore: with drop_remainder=False (partial last batches) and with it True (the
    # shards still hold different numbers of whole batches).
    ms_variants = ("keep_remainder", "drop_remainder")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.shard = "hash"
        plan.drop_last = variant == "drop_remainder"


class DuplicateRankId(Fault):
    name = "duplicate-rank-id"
    description = "two ranks take the same rank id for sharding (RANK_ID copied between hosts)"
    symptom = "two ranks see identical batches, one shard is never seen (forum table, row 1)"
    category = "config.rank_identity"
    measured = "torch, ws 2: both ranks read identical batches and log identical losses; one shard is never seen; accuracy 0.97"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.shard_id = plan.rank - 1


class DroppedRank(Fault):
    name = "dropped-rank"
    description = "after a simulated comm timeout and retry, one rank's gradients are left out of the average while it keeps updating alone"
    symptom = "loss jumps after a retry in the comm log, no error (playbook 2.3)"
    category = "sync.incomplete_reduce"
    not_on = {
        "mindspore": "needs an all-reduce over a sub-group that excludes one rank; not built on MindSpore's CPU collectives"
    }
    measured = "torch, ws 2: from the onset the left-out rank's reduced gradients, then its parameters, differ from the others'; accuracy 0.95 vs 0.99; the loss keeps decreasing (no visible jump at this size)"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.drop_rank_at = plan.onset
        plan.dropped_rank = self.bad_rank(plan.world_size)


class GradAccumMisaligned(Fault):
    name = "grad-accum-misaligned"
    description = "with accumulation over 4 micro-steps one rank runs one micro-step more"
    symptom = "accumulation counter off by one on one rank (playbook 4.3)"
    category = "sync.step_misalignment"
    measured = (
        "torch, ws 2: no_sync — parameters stay bitwise identical (only the micro-step counters, 5 vs 4, reveal it, as facts.md says); the bad rank exhausts its shard earlier, so the job ends with a collective error. extra_update — backward counts differ from the onset and one all-reduce more makes the job fail at the end"
        "; MindSpore 2.10, ws 2: both variants keep parameters and optimizer state bitwise "
        "identical (collectives pair by order; the extra update uses the same reduced gradients); "
        "only micro/backward counters differ from the onset (live check: counter); the rank that "
        "uses more batches runs out first and the other's last AllReduce fails, msrun exits 1."
    )
    variants = ("no_sync", "extra_update")
    frameworks = ("torch", "mindspore")
    ms_styles_not_on = {
        "cell": "TrainOneStepCell has no gradient accumulation: every call reduces and updates",
        "model": "Model.train has no gradient accumulation: every step reduces and updates",
    }

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
    measured = "torch, ws 2: parameters and optimizer state differ from the onset step on; optimizer-step counts differ by one; accuracy barely changes (0.99/0.986)"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.skip_step_at = plan.onset


class ExtraStep(Fault):
    name = "extra-step"
    description = "one rank calls optimizer.step() twice once"
    symptom = "replicas part from one step on, no error"
    category = "sync.step_misalignment"
    measured = "torch, ws 2: parameters and optimizer state differ from the onset on; optimizer-step counts differ by one; accuracy unchanged"

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.extra_step_at = plan.onset


class LossHparamMismatch(Fault):
    name = "loss-hparam-mismatch"
    description = "the playbook's asymmetric loss (ASL) with margin 0.05 on half the ranks and 0.1 on the others"
    symptom = "looks like a comm fault: per-rank loss offsets, averaged gradients of different losses (playbook 3.5)"
    category = "loss.definition_mismatch"
    measured = (
        "torch, ws 2: replicas stay identical (gradients are averaged), per-rank losses sit at a persistent offset; accuracy unchanged (0.99)"
        "; MindSpore 2.10, ws 2: parameters identical; per-rank loss offset (mean 0.29 vs 0.26 "
        "over 66 steps), reduce_ratio 0.68 vs 0.84; snapshot loss.params.margin 0.05 vs 0.1."
        "; MindSpore cell and model styles: named loss.definition_mismatch."
    )
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank >= plan.world_size // 2:
            plan.asl_margin = 0.1


class GradSum(Fault):
    name = "grad-sum"
    description = "gradients are summed across ranks, not averaged (gradients_mean=False)"
    symptom = "effective learning rate × world size: jumps or divergence (forum table, row 4)"
    category = "sync.reduce_op"
    measured = (
        "torch, ws 2: replicas identical; the post-reduce gradient norm exceeds the ranks' mean local norm at most steps; training still converges at this learning rate (0.99): no jump"
        "; MindSpore 2.10, ws 2: (gradients_mean=False) parameters identical; reduce_ratio ≈1.5 "
        "vs ≈0.75 healthy (×2); snapshot ddp.gradients_mean false; loss still falls."
        "; MindSpore cell and model styles: named sync.reduce_op (gradients_mean=False in the snapshot)."
    )
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.reduce_op = "sum"


class OptimizerStateMismatch(Fault):
    name = "optimizer-state-mismatch"
    description = "from the onset one rank's optimizer runs with another momentum"
    symptom = "loss curve normal-looking but the model does not converge (quick-ref last row)"
    category = "optim.state_mismatch"
    measured = (
        "torch, ws 2: identical reduced gradients, but parameters and optimizer state differ from the onset; accuracy 0.97/0.98"
        "; MindSpore 2.10, ws 2: momentum changed with ops.assign (Parameter.set_data on "
        "optimizer.momentum is silently ignored by SGD's jit-compiled update after its first "
        "call, though asnumpy() shows the new value); opt_fp and param_fp differ from the onset "
        "step; live check 'param, opt', first tensor fc1.weight."
        "; MindSpore cell and model styles: parameters part at the onset (20), named optim.state_mismatch."
    )
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
    measured = (
        "torch, ws 2 (hand-written all-reduce): parameters differ from step 1 and never meet again; accuracy 0.975/0.99 by rank"
        "; MindSpore 2.10, ws 2: no ms.set_seed (and no ds.config.set_seed before the model, "
        "which also seeds init): param_fp differ at every step from step 1, live check first "
        "tensor fc1.weight. GRAPH mode with parameter_broadcast=True makes them equal from step "
        "1; PyNative ignores parameter_broadcast, with ms.jit too."
        "; MindSpore, every style (model, cell, cell in GRAPH mode, functional, a jitted step): named at step 0 from the weights fingerprinted before the first update."
    )
    sync = "allreduce"
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.seed_model = False


class ModeMismatch(Fault):
    name = "mode-mismatch"
    description = "one rank forgot model.train(): dropout off and BatchNorm frozen there"
    symptom = "one rank's loss persistently lower/higher (forum: set_train)"
    category = "model.mode_mismatch"
    measured = (
        "torch, ws 2: the eval-mode rank reports a lower loss (no dropout) and its module modes differ; parameters stay identical under DDP"
        "; MindSpore 2.10, ws 2: (set_train(False) on rank 1) train_mode differs from step 1; "
        "parameters identical; rank 1 loss mean 0.59 vs 0.35, reduce_ratio 1.13 vs 0.55."
        "; MindSpore cell and model styles: named at step 1 (Model.train calls set_train(True) at its start, so the lab's model style leaves the net in eval mode from a rank-local callback); in GRAPH mode (TrainOneStepCell) the parameters also part from step 1."
    )
    frameworks = ("torch", "mindspore")

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.train_mode = False


class BufferDivergence(Fault):
    name = "buffer-divergence"
    description = "BatchNorm running statistics are never synchronised (broadcast_buffers=False)"
    symptom = "training loss fine, evaluation differs by rank"
    category = "model.buffer_divergence"
    not_on = {
        "mindspore": "MindSpore never synchronises BatchNorm statistics in data parallel: they differ in every healthy run, so there is no fault to inject"
    }
    measured = "torch, ws 2: BatchNorm running statistics differ across ranks from step 1; parameters identical; training accuracy unaffected"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.broadcast_buffers = False


class Fp16Overflow(Fault):
    name = "fp16-overflow"
    description = "gradients in float16 without loss scaling (underflow), or with a dynamic scaler whose skip decision is taken per rank"
    symptom = "overflow flags, loss stalls or replicas part after a local skip (forum: 混合精度)"
    category = "numeric.overflow"
    measured = (
        "torch, ws 2: no_scaling — no measurable effect on this small model (its gradients fit fp16). local_skip — at the first overflow (step ~52, when the dynamic scale doubles) one rank skips alone and the replicas part; the other ranks never learn of it"
        "; MindSpore 2.10, ws 2: no_scaling: no overflow flag, parameters identical, loss as "
        "healthy; only the snapshot shows it (grad_dtype float16, no loss scaler). local_skip "
        "(ms.amp.DynamicLossScaler 2**24, window 20, all_finite on local gradients): both ranks "
        "skip steps 1-6 together, then at step 29 rank 0 alone overflows and skips: param_fp and "
        "opt_fp differ from there, the loss scales drift apart."
    )
    variants = ("no_scaling", "local_skip")
    frameworks = ("torch", "mindspore")
    ms_styles_not_on = {
        "cell": "TrainOneStepWithLossScaleCell does not run on MindSpore's CPU backend (2.10)",
        "model": "Model with a DynamicLossScaleManager does not run on MindSpore's CPU backend (2.10)",
    }

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.fp16_grads = True
        plan.loss_scale = "dynamic_local" if variant == "local_skip" else "none"


class LrNotScaled(Fault):
    name = "lr-not-scaled"
    description = "the world size grew but the learning rate stayed at the single-card value"
    symptom = "all ranks agree, loss decreases slower than it should (quick-ref row 4)"
    category = "hparam.lr_scaling"
    measured = "torch, ws 2: no visible effect on loss or accuracy within 150 steps (0.99); only the snapshot compared with the single-card recipe reveals it"

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.lr = plan.base_lr


class LrTooHigh(Fault):
    name = "lr-too-high"
    description = "not a sync fault: the learning rate is far too high on every rank"
    symptom = "monotonic divergence that single-card training shows too (playbook 1.1)"
    category = "train.divergence"
    measured = (
        "torch, ws 2: the loss diverges on every rank in lockstep (replicas stay identical); accuracy 0.09 (chance)"
    )

    def apply(self, plan: RankPlan, variant: str) -> None:
        plan.lr = plan.lr * 40


class RankCrash(Fault):
    name = "rank-crash"
    description = "one rank dies out of memory mid-run"
    symptom = "the others fail with connection errors that blame the network (forum: 部分进程异常退出)"
    category = "process.crash"
    measured = (
        "torch, ws 2: the crashed rank logs 'DefaultCPUAllocator: can't allocate memory'; the survivor fails at once with gloo 'Connection closed by peer'"
        "; MindSpore 2.10, ws 2: rank 1 raises 'RuntimeError: Allocate memory failed' (a real "
        "ops.zeros allocation); msrun kills the other worker and exits 1 after 26 s with "
        "MS_NODE_TIMEOUT=8 (53 s with defaults); the scheduler names node 1 ('The node: 1 is "
        "timed out')."
        "; MindSpore cell and model styles: named process.crash."
    )
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
    not_on = {
        "mindspore": "MindSpore's CPU collectives have no per-call timeout to exceed in the lab; the stall is covered by rank-crash and msrun's node timeout"
    }
    measured = "torch, ws 2: the waiting rank fails after the process-group timeout with gloo 'Timed out waiting … for recv'; the stalled rank then fails with connection errors"
    ends_in_error = True

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.stall_at = plan.onset


class BitFlip(Fault):
    name = "bit-flip"
    description = (
        "silent hardware corruption: one bit of one float32 value flips on one rank — in a parameter, "
        "in the reduced gradient after the all-reduce, or in the optimizer's momentum — once at the "
        "onset, or sporadically from there"
    )
    symptom = "no error anywhere; one replica parts from the others (a failing chip or memory cell)"
    category = "hardware.corruption"
    measured = (
        "torch, ws 4, flip at step 40 on rank 2, K=10 (benchmarks/bitflip_effects.py, docs/hardware.md): every variant "
        "named at the check of step 40 (rank 2, the flipped tensor), SD971 hardware.corruption. param (bit 22 of "
        "conv1.weight[0]): silent drift — replicas stay apart to the end, final loss moved like another seed's "
        "(0.0327 vs 0.0314, 0.0200 vs 0.0197, 0.0271 vs 0.0321 for seeds 0-2), accuracy 0.989-0.997. param_low "
        "(bit 0): harmless — the one-ulp difference is rounded away, replicas bitwise equal again by the end. grad, "
        "opt (bit 22 of the reduced gradient / momentum): silent drift like param. sporadic (every 60 steps): parted "
        "from step 40 on. param_exponent (bit 30 of bn1.weight[0], ~1.0 -> inf): loss blow-up — NaN on rank 2 at "
        "step 41, through the all-reduce on every rank from step 42, accuracy 0.13; the check of step 40 named rank 2 "
        "first. With --on-mismatch heal: every variant restored from rank 0 at the check of step 40 itself, before "
        "step 41 (307,424 bytes, 2-19 ms): bitwise the clean run of the same seed from the next check on, the "
        "blow-up included (seeds 0-2). A flip at step 31 (9 steps before the check) is healed at 40 too, but the "
        "run then follows its own trajectory, like the same flip without heal. "
        "ws 2: both ranks named, no culprit."
    )
    # (target, bit, repeat every N steps, tensor): bit 22 is the top mantissa bit (the value moves by
    # up to half), bit 30 the top exponent bit (1.0 becomes infinite, 0.05 ~1e37), bit 0 the lowest.
    VARIANTS: ClassVar[dict[str, tuple[str, int, int, str]]] = {
        "param": ("param", 22, 0, "conv1.weight"),
        "param_low": ("param", 0, 0, "conv1.weight"),
        "param_exponent": ("param", 30, 0, "bn1.weight"),
        "grad": ("grad", 22, 0, "conv1.weight"),
        "opt": ("opt", 22, 0, "conv1.weight"),
        "sporadic": ("param", 22, 60, "conv1.weight"),
    }
    variants = tuple(VARIANTS)
    matrix_variants = ("param", "grad", "opt")  # one per place; the bit's effect is in `measured`
    not_on = {"mindspore": "the MindSpore lab script has no bit-flip knob yet (and the probe no heal there)"}

    @staticmethod
    def bad_rank(world_size: int) -> int:
        return world_size // 2  # rank 2 of 4, rank 1 of 2

    def apply(self, plan: RankPlan, variant: str) -> None:
        if plan.rank == self.bad_rank(plan.world_size):
            plan.bitflip, plan.bitflip_bit, plan.bitflip_every, plan.bitflip_tensor = self.VARIANTS[variant or "param"]
            plan.bitflip_at = plan.onset


FAULTS: dict[str, Fault] = {
    f.name: f()
    for f in (
        Clean,
        UnseededShuffle,
        ShuffleAfterShard,
        ShardOverlap,
        UnevenShards,
        DuplicateRankId,
        DroppedRank,
        GradAccumMisaligned,
        SkippedStep,
        ExtraStep,
        LossHparamMismatch,
        GradSum,
        OptimizerStateMismatch,
        InitMismatch,
        ModeMismatch,
        BufferDivergence,
        Fp16Overflow,
        LrNotScaled,
        LrTooHigh,
        RankCrash,
        CommTimeout,
        BitFlip,
    )
}


def check_fault(name: str, variant: str = "") -> None:
    """An InputError, in one line with the closest known name, unless ``name`` is a
    fault of the catalog and ``variant`` (when given) one of its variants."""
    if name not in FAULTS:
        raise InputError(f"unknown fault {name!r}{did_you_mean(name, FAULTS)}; `syncdoctor lab list` shows the catalog")
    variants = [v for v in FAULTS[name].variants if v]
    if variant and variant not in variants:
        known = f"one of {', '.join(variants)}" if variants else "none"
        raise InputError(
            f"fault {name!r} has no variant {variant!r}{did_you_mean(variant, variants)}; its variants: {known}"
        )


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

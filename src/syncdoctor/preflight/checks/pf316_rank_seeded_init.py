from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import CallInfo, ScriptContext

# Calls that copy one rank's parameters to the others, or wrappers that do it when
# they are built (DDP broadcasts rank 0's parameters and buffers at construction).
_BROADCASTS = frozenset(
    {
        "broadcast",
        "broadcast_parameters",
        "broadcast_object_list",
        "sync_module_states",
        "_sync_module_states",
        "broadcast_coalesced",
        "_broadcast_coalesced",
    }
)


def _is_seed_call(c: CallInfo) -> bool:
    """torch.manual_seed / torch.cuda.manual_seed[_all] / mindspore.set_seed, or a
    seed-everything helper (set_seed, seed_everything, setup_seed, ...)."""
    name = c.name.lower()
    if "seed" not in name or name in ("initial_seed", "get_seed"):
        return False
    if c.under("torch"):
        return "manual_seed" in name
    if c.under("mindspore"):
        return name == "set_seed"
    if c.under("numpy", "random"):
        return False  # numpy/python seeds do not decide a framework's initial weights
    return name.startswith(("set_seed", "seed_everything", "setup_seed", "init_seed", "fix_seed"))


def _builds_model(ctx: ScriptContext, c: CallInfo) -> bool:
    return (c.under("torch.nn", "mindspore.nn") and c.name[:1].isupper()) or c.name in ctx.classes


class RankSeededInit(Check):
    """The framework's seed depends on the rank before the model is built, and nothing
    copies one rank's parameters to the others.

    **Symptom:** the ranks never agree: replica fingerprints differ from the first
    check, the loss is noisier than on one card, and the averaged gradients pull
    differently initialised models in one direction.

    **Cause:** `torch.manual_seed(rank)` (or `seed + rank`, `set_seed(rank)`) makes
    each rank draw its own initial weights. DistributedDataParallel would broadcast
    rank 0's parameters when it wraps the model; a hand-written all-reduce loop,
    MindSpore data parallelism or Horovod without `broadcast_parameters` do not.

    **Fix:** seed every rank with the same value before building the model (seed by
    rank afterwards, for dropout or augmentation, if wanted), or broadcast the
    parameters from rank 0 once after building it (wrap it in DDP,
    `hvd.broadcast_parameters`, `dist.broadcast` per parameter).
    """

    code = "PF316"
    name = "rank-seeded-init"
    severity = "error"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if "ddp" in ctx.project_facts or not ctx.data_parallel:
            return
        if any(c.name in _BROADCASTS for c in ctx.calls):
            return
        for seed in ctx.calls:
            if not _is_seed_call(seed):
                continue
            value = seed.arg(0, "seed")
            if value is None or not ctx.rank_dependent(value):
                continue
            built = next((c for c in ctx.calls if c.node.lineno >= seed.node.lineno and _builds_model(ctx, c)), None)
            if built is None:
                continue
            yield Hit.at(
                seed.node,
                f"{seed.dotted or seed.name}() gets a rank-dependent seed before "
                f"the model is built (line {built.node.lineno}) and no DDP wrapper or "
                "broadcast copies the parameters: each rank starts from its own weights; "
                "seed every rank alike before building the model",
            )

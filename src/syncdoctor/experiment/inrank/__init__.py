"""What one variant of `syncdoctor experiment` changes inside a rank process.

The orchestrator reruns the user's job with SYNCDOCTOR_VARIANT set (settings.VARIANTS);
the patches here apply that one change with no edit of the script, and each rank
writes ONE event record `event="variant"` saying what was done (`applied`, `what`) or
why it could not be (`why`), at the end of its first optimizer step.

- seeds: python `random`, numpy and torch are seeded with one constant at start, and
  every later seeding call (torch.manual_seed/seed, torch.cuda.manual_seed(_all),
  random.seed, numpy.random.seed/default_rng/RandomState, DistributedSampler's seed,
  unseeded calls included) gets a value that depends only on the constant, the API
  and how many calls of that API came before: the same on every rank.
- broadcast: rank 0's parameters and floating buffers are broadcast over the job's
  default group where the probe takes the model (DDP construction, attach, or the first
  backward/step of a loop without DDP): every rank is at that point.
- hparams: rank 0's optimizer param-group scalars and the loss object's public scalar
  attributes are forced on every rank before every optimizer step, through the job's
  c10d store: rank 0 publishes what it will use at its n-th step, and the others wait
  (bounded) until rank 0 has reached its n-th step, so a value rank 0 changes between
  steps is used by every rank at the same step.
- data: a map-style DataLoader's sampler becomes a DistributedSampler over one global
  order (seed 0, drop_last), its epoch advanced at each pass over the loader.
- modes: at the first grad-enabled forward rank 0's train/eval flags of every module
  are taken and re-applied at every grad-enabled forward.
- single: in the one-rank rerun, a DataLoader's batch size is multiplied by the world
  size of the compared run (SYNCDOCTOR_VARIANT_WORLD), so a step sees the same global batch.

One module per variant (seeds, broadcast, hparams, data and single, modes), the
agreement they share (agree.py) and what this process holds (run.py: `RUN`).

Safety: every patch runs its own work under `safe` (run.py): on any failure the variant
records applied=False with the reason and training continues unchanged. The one
cross-rank agreement (`_agree`) is bounded in time and decided through one atomic
compare-and-set in the store, so either every rank acts (and meets the others in the
broadcast) or none does. Framework-free at import: torch and numpy are imported in
the functions that need them.
"""

from __future__ import annotations

import os
import time
from typing import Any

from syncdoctor import settings
from syncdoctor.experiment.inrank import broadcast, data, hparams, modes, seeds
from syncdoctor.experiment.inrank.agree import agree_on
from syncdoctor.experiment.inrank.run import RUN, Status, safe, variant
from syncdoctor.probe.core import hook_points
from syncdoctor.probe.core.state import STATE

__all__ = ["RUN", "agree_on", "environment", "install_torch", "status_record", "variant"]


def install_torch() -> None:
    """Called once torch is imported in a process of `syncdoctor run` (probe/torch/attach.py)."""
    name = os.environ.get(settings.VARIANT_ENV, "").strip()
    if not name or RUN.status is not None:
        return
    RUN.status = Status(name)
    if name not in settings.VARIANTS:
        RUN.status.fail(f"unknown variant {name!r} (known: {', '.join(settings.VARIANTS)})")
    elif name == "seeds":
        safe(seeds.install)
    elif name in ("data", "single"):
        safe(data.patch_loader)
        if name == "single":
            safe(data.install_single_lr)
    elif name == "hparams":
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(lambda opt, args, kwargs: safe(hparams.before_step, opt))
    elif name == "modes":
        from torch.nn.modules.module import register_module_forward_pre_hook

        RUN.modes_hook = register_module_forward_pre_hook(lambda module, args: safe(modes.first_forward, module))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    RUN.post_hook = register_optimizer_step_post_hook(lambda opt, args, kwargs: safe(_write_event, opt))


def _write_event(optimizer: Any) -> None:
    """The end of the first optimizer step of a watched optimizer: write the record."""
    from syncdoctor.records import contract

    if RUN.status is None or RUN.status.written:
        return
    probe = next((p for p in STATE.probes if p.optimizer is optimizer), None)
    if probe is None:
        return
    RUN.status.written = True
    handle = RUN.take("post_hook")
    if handle is not None:
        handle.remove()
    record = RUN.status.record()
    state = "applied" if record["applied"] else "not applied"
    detail = record.get("what") if record["applied"] else record.get("why")
    probe.writer.write(
        contract.KIND_EVENT,
        rank=probe.rank,
        t=time.time(),
        step=probe.step,
        event="variant",
        message=f"experiment variant {record['name']} {state}: {detail}"[:2000],
        variant=record,
    )


def before_snapshot(probe: Any, optimizer: Any) -> None:
    """The probe binds `optimizer` and is about to write the configuration it sees
    (attach, or the first step of a job attached zero-code): every rank is there."""
    if variant() == "hparams":
        safe(hparams.start, probe, optimizer)
    elif variant() == "data":
        safe(data.describe_real_loader, probe)


def status_record() -> dict[str, Any] | None:
    """What the variant event of this process says (None: a plain run)."""
    return RUN.status.record() if RUN.status is not None else None


def environment(name: str) -> dict[str, str]:
    """What a rank process needs in its environment to run under variant `name`: the
    variant, and this module among the boot's plugins (it registers below)."""
    return {settings.VARIANT_ENV: name, settings.PLUGINS_ENV: __name__}


# Imported by the boot of a rank process (settings.PLUGINS_ENV): act at the probe's hook points.
hook_points.register(hook_points.TORCH_PATCHED, install_torch)
hook_points.register(hook_points.BEFORE_DDP, broadcast.before_ddp)
hook_points.register(hook_points.BEFORE_WATCH, broadcast.before_watch)
hook_points.register(hook_points.BEFORE_SNAPSHOT, before_snapshot)

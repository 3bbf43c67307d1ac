from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class BufferDivergence(Rule):
    """BatchNorm running statistics differ across ranks and are never synchronised.

    **Symptom:** training loss looks fine, but evaluation gives different accuracy
    depending on which rank evaluates; checkpoints from different ranks differ.

    **Cause:** DDP with `broadcast_buffers=False` (or a framework setup that keeps
    BN statistics local) lets each rank's running mean/var follow its own data.

    **Quick check:** compare `bn.running_mean` across ranks at the start of a forward pass.

    **Fix:** keep DDP's `broadcast_buffers=True`, convert to SyncBatchNorm, or
    all-reduce the BN statistics before evaluating and checkpointing.
    """

    code = "SD503"
    name = "buffer-divergence"
    category = "model.buffer_divergence"
    stage = "forward"
    title = "BatchNorm buffers diverge across ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        div = ev.replicas.divergence
        if div and "buffer" in div.what and not ({"param", "counter", "mode"} & set(div.what)):
            return self.found(
                0.9,
                [f"buffers differ at forward start at step {div.step}, where DDP had just broadcast them"],
                ranks=div.ranks,
                step=div.step,
            )
        broadcast = ev.snapshot_values("ddp", "broadcast_buffers")
        if (
            ev.buffers.unsynced_differ
            and any(v is False for v in broadcast.values())
            and not (div and {"param", "counter", "mode"} & set(div.what))
        ):
            step = ev.buffers.first_unsynced_step
            return self.found(
                0.85,
                [
                    f"buffers (BatchNorm running statistics) differ across ranks from step {step}",
                    "DDP was built with broadcast_buffers=False, so nothing ever syncs them",
                ],
                ranks=ev.ranks,
                step=step,
                severity="warning",
            )
        return None

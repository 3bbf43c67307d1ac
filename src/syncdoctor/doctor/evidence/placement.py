"""Where each rank's tensors sit under a sharded or hybrid job (probe/torch/mesh.py): the
placement classes and replica keys, the device mesh, and whether the optimizer
state is a replica at all."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from syncdoctor.doctor.evidence.sources import Facet


class Placement(Facet):
    """``ev.placement``: the placement of a sharded or hybrid job (empty under plain data parallelism)."""

    @cached_property
    def replica(self) -> dict[int, dict[str, Any]]:
        """Per rank, the placement classes and replica keys of a sharded/hybrid job
        (probe/torch/mesh.py); empty under plain data parallelism."""
        return {r: snap["replica"] for r, snap in self.ev.snapshots.items() if isinstance(snap.get("replica"), dict)}

    @cached_property
    def mesh(self) -> dict[str, Any] | None:
        """The device mesh of a sharded/hybrid job (shape, dimension names, ranks)."""
        return next((info.get("mesh") for info in self.replica.values() if info.get("mesh")), None)

    @cached_property
    def opt_state_replicated(self) -> bool:
        """False when some rank's optimizer holds only its own part of the state
        (ZeRO): its fingerprint then differs across ranks by design."""
        return all(v is not False for v in self.ev.snapshot_values("optimizer", "state_replicated").values())

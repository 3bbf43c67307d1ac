from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats, visible_devices
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.environment import EnvGroup, EnvSnapshot
from syncdoctor.preflight.model import Hit


def physical_device(snap: EnvSnapshot) -> str | None:
    """The card a process was pinned to explicitly: DEVICE_ID (through the visible list
    when there is one) or a one-card visible list. LOCAL_RANK-derived placement is
    PF204's concern."""
    visible = visible_devices(snap)
    device_id = snap.get_int("DEVICE_ID")
    if device_id is not None:
        if visible and 0 <= device_id < len(visible):
            return visible[device_id]
        return str(device_id)
    if visible is not None and len(visible) == 1:
        return visible[0]
    return None


class DuplicateDevice(Check):
    """Two processes on one node are pinned to the same device.

    **Symptom:** out-of-memory or device-busy on one card while another card idles;
    on Ascend, HCCL initialisation fails for the pair.

    **Cause:** DEVICE_ID (or a one-card CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES)
    set from a variable that is the same for two processes of the node.

    **Fix:** derive DEVICE_ID from the local rank: one process per card.
    """

    code = "PF202"
    name = "duplicate-device"
    severity = "error"
    target = "env"

    def evaluate(self, ctx: EnvGroup) -> Iterator[Hit]:
        keyed = [(s, physical_device(s)) for s in ctx.snapshots]
        for (first, dev), (dup, _), n in repeats(keyed, lambda p: (p[0].node, p[1]) if p[1] is not None else None):
            node = "" if first.node == "?" else f" on {first.node}"
            yield Hit(f"device {dev} is used by {n} processes{node} (also by {first.path})", dup.line, 1, dup.path)

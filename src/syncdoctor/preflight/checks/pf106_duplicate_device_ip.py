from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class DuplicateDeviceIp(Check):
    """Two devices of the rank table share a `device_ip`.

    **Symptom:** HCCL connects two ranks to the same NIC: link setup times out or
    traffic for one rank arrives at another.

    **Cause:** a device entry copied without changing its address, or the same
    server's addresses pasted for a second server.

    **Fix:** every NPU has its own NIC address; take each from `hccn_tool`.
    """

    code = "PF106"
    name = "duplicate-device-ip"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        devices = [d for g in ctx.table.groups for d in g.devices]
        key = lambda d: str(d.device_ip).strip() if d.device_ip is not None else None  # noqa: E731
        for first, dup, n in repeats(devices, key):
            yield Hit(
                f"device_ip {dup.device_ip} is used by {n} devices (rank_id {first.rank_id!r} "
                f"at line {first.at('device_ip')[0]} and rank_id {dup.rank_id!r})",
                *dup.at("device_ip"),
            )

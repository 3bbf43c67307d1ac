from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class InvalidDeviceIp(Check):
    """A `device_ip` is missing or not a usable IP address.

    **Symptom:** HCCL link setup times out for the ranks of that device; the other
    ranks report a connection error that blames the network.

    **Cause:** a placeholder left from a template (`xx.xx.xx.xx`), a typo, or a
    host/loopback address where the NPU's own NIC address belongs.

    **Fix:** use the address `hccn_tool -i DEVICE -ip -g` reports for that NPU.
    """

    code = "PF105"
    name = "invalid-device-ip"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            for d in group.devices:
                problem = _problem(d.device_ip)
                if problem:
                    yield Hit(
                        f"device_ip of rank_id {d.rank_id!r} (server {d.server}, device {d.device_id!r}) {problem}",
                        *d.at("device_ip"),
                    )


def _problem(value: object) -> str | None:
    if value is None:
        return "is missing"
    try:
        ip = ipaddress.ip_address(str(value).strip())
    except ValueError:
        return f"{value!r} is not an IP address"
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast:
        return f"{value!r} is not a device address (unspecified, loopback or multicast)"
    return None

from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class DuplicateDeviceId(Check):
    """A server lists the same `device_id` twice (or a device without one).

    **Symptom:** two ranks are started on one NPU: out-of-memory or a device-busy
    error on that card, while another card stays idle.

    **Cause:** a device entry copied within a server without changing `device_id`.

    **Fix:** give every device of a server its own physical `device_id` (0-7 on an
    8-card server).
    """

    code = "PF104"
    name = "duplicate-device-id"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            for server in group.servers:
                for d in server.devices:
                    if d.device_id is None:
                        yield Hit(
                            f"device with rank_id {d.rank_id!r} on server {server.server_id} has no device_id", *d.pos
                        )
                key = lambda d: str(d.device_id).strip() if d.device_id is not None else None  # noqa: E731
                for first, dup, n in repeats(server.devices, key):
                    yield Hit(
                        f"device_id {dup.device_id!r} appears {n} times on server "
                        f"{server.server_id} (first at line {first.at('device_id')[0]})",
                        *dup.at("device_id"),
                    )

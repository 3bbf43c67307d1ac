from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.rank_table import as_int


class RankIdNotContiguous(Check):
    """A `rank_id` is missing, not a whole number, or outside 0..N-1.

    **Symptom:** HCCL refuses the table, or waits forever for a rank that no device
    holds.

    **Cause:** ids numbered from 1, a gap left after a server was removed, or a
    device entry without `rank_id`.

    **Fix:** number `rank_id` from 0 to N-1 (N devices in the table), each once.
    Ids that are in range but repeated are reported by PF102 instead.
    """

    code = "PF103"
    name = "rank-id-not-contiguous"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            devices = group.devices
            n = len(devices)
            ids = {as_int(d.rank_id) for d in devices} - {None}
            missing = sorted(set(range(n)) - ids)
            for d in devices:
                rid = as_int(d.rank_id)
                if d.rank_id is None:
                    msg = f"device {d.device_id!r} on server {d.server} has no rank_id"
                elif rid is None:
                    msg = f"rank_id {d.rank_id!r}{group.where()} is not a whole number"
                elif rid >= n:
                    msg = f"rank_id {rid}{group.where()} is out of range: {n} devices take ids 0..{n - 1}" + (
                        f" (missing: {_short(missing)})" if missing else ""
                    )
                else:
                    continue
                yield Hit(msg, *d.at("rank_id"))


def _short(ids: list[int]) -> str:
    return ", ".join(map(str, ids[:8])) + (", ..." if len(ids) > 8 else "")

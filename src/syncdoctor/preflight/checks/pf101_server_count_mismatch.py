from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.rank_table import as_int


class ServerCountMismatch(Check):
    """`server_count` differs from the number of servers listed.

    **Symptom:** the job hangs at communicator initialisation, or HCCL reports a
    rank-table check failure on some nodes only.

    **Cause:** a table edited for more or fewer machines (a node added or removed)
    without updating `server_count` (`server_num` in the older group format).

    **Fix:** set `server_count` to the number of entries of `server_list`.
    """

    code = "PF101"
    name = "server-count-mismatch"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            if group.server_count is None:
                continue
            declared, listed = as_int(group.server_count), len(group.servers)
            if declared is None:
                msg = f"server_count {group.server_count!r}{group.where()} is not a whole number"
            elif declared != listed:
                msg = (
                    f"server_count is {declared}{group.where()} but {listed} "
                    f"server{'s are' if listed != 1 else ' is'} listed"
                )
            else:
                continue
            yield Hit(msg, *group.server_count_pos)

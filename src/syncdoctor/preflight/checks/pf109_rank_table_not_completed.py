from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class RankTableNotCompleted(Check):
    """The rank table's `status` is not "completed".

    **Symptom:** the job starts with a partial table: some servers or devices are
    missing and initialisation hangs.

    **Cause:** the table was copied while the cluster scheduler (Ascend Operator)
    was still writing it ("initializing").

    **Fix:** wait until `status` is "completed" before starting the job.
    """

    code = "PF109"
    name = "rank-table-not-completed"
    severity = "warning"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        status = ctx.table.status
        if status is not None and str(status).strip().lower() != "completed":
            yield Hit(
                f'status is {status!r}, not "completed": the table may still be being written', *ctx.table.status_pos
            )

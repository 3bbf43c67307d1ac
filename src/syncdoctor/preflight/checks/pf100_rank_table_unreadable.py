from __future__ import annotations

from collections.abc import Iterable

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit


class RankTableUnreadable(Check):
    """The rank table is not valid JSON or not a rank table.

    **Symptom:** HCCL initialisation fails on every rank, or a launcher silently
    falls back to a stale table.

    **Cause:** a hand-edited hccl.json with a missing comma or bracket, comments left
    in from a documentation example, or a file that lacks `server_list`/`group_list`.

    **Fix:** repair the JSON at the position given (`python -m json.tool FILE` shows
    it too) and keep comments out of the file.
    """

    code = "PF100"
    name = "rank-table-unreadable"
    severity = "error"
    target = "rank_table"
    reports_unreadable = True  # the runner reports what could not be parsed

    def evaluate(self, ctx: object) -> Iterable[Hit]:
        return ()

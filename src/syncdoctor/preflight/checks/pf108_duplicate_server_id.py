from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class DuplicateServerId(Check):
    """Two entries of `server_list` have the same `server_id`.

    **Symptom:** ranks of two machines are mapped to one host; one machine's ranks
    never connect.

    **Cause:** a server block copied for a new machine without changing its id.

    **Fix:** give each server its own `server_id` (normally its host IP).
    """

    code = "PF108"
    name = "duplicate-server-id"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            for first, dup, n in repeats(group.servers, lambda s: s.server_id):
                yield Hit(
                    f"server_id {dup.server_id} is listed {n} times{group.where()} (first at line {first.pos[0]})",
                    *dup.pos,
                )

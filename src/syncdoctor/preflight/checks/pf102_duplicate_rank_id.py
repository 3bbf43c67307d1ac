from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.rank_table import as_int


class DuplicateRankId(Check):
    """Two devices of the rank table have the same `rank_id`.

    **Symptom:** two ranks see identical batches while one shard is never read; the
    loss is noisier than on one card, or initialisation hangs.

    **Cause:** a device entry copied between servers without renumbering it.

    **Fix:** number `rank_id` from 0 to N-1, each once, in server then device order.
    """

    code = "PF102"
    name = "duplicate-rank-id"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        for group in ctx.table.groups:
            key = lambda d: as_int(d.rank_id) if as_int(d.rank_id) is not None else d.rank_id  # noqa: E731
            for first, dup, n in repeats(group.devices, key):
                line = first.at("rank_id")[0]
                yield Hit(
                    f"rank_id {dup.rank_id!r}{group.where()} is given to {n} devices "
                    f"(first on server {first.server} line {line}, again on server {dup.server})",
                    *dup.at("rank_id"),
                )

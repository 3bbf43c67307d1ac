from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext
from syncdoctor.preflight.model import Hit


class RankSizeMismatch(Check):
    """RANK_SIZE (or WORLD_SIZE) differs from the number of devices in the rank table.

    **Symptom:** initialisation hangs waiting for ranks that are never started, or
    fails with a rank-table/rank-size mismatch on some nodes.

    **Cause:** the launch script sets RANK_SIZE for another cluster size than the
    table it points RANK_TABLE_FILE at.

    **Fix:** derive RANK_SIZE from the table (the number of device entries), or
    regenerate the table for the cards actually used.
    """

    code = "PF107"
    name = "rank-size-mismatch"
    severity = "error"
    target = "rank_table"

    def evaluate(self, ctx: RankTableContext) -> Iterator[Hit]:
        sizes = {len(g.devices) for g in ctx.table.groups}
        table = ctx.table.path
        sources: list[tuple[str, str, str]] = []  # (value, variable, where)
        if ctx.environ is not None:
            for var in ("RANK_SIZE", "WORLD_SIZE"):
                if ctx.environ.get(var, "").strip():
                    sources.append((ctx.environ[var].strip(), var, "the environment"))
                    break
        for group in ctx.env_groups:
            for snap in group.snapshots:
                for var in ("RANK_SIZE", "WORLD_SIZE"):
                    value = snap.get(var)
                    if value is not None:
                        sources.append((value, var, snap.path))
                        break
        reported: set[str] = set()
        for value, var, where in sources:
            if value in reported or (value.isdigit() and int(value) in sizes):
                continue
            reported.add(value)
            yield Hit(
                f"{var}={value} in {where} but {table} lists {' or '.join(map(str, sorted(sizes)))} devices",
                1,
                1,
                table,
            )

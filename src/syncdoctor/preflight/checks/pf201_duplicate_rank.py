from __future__ import annotations

from collections.abc import Iterator
from operator import methodcaller

from syncdoctor.preflight.checks._common import repeats
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.environment import EnvGroup
from syncdoctor.preflight.model import Hit


class DuplicateRank(Check):
    """Two processes were started with the same RANK (or RANK_ID).

    **Symptom:** two ranks read the same shard and another shard is never seen;
    loss jumps or the process group never forms.

    **Cause:** a launch script that copies RANK_ID between hosts, or computes it
    from the local index only (RANK_ID=$i on every node).

    **Fix:** RANK = node_rank × cards_per_node + local_rank, unique over the job;
    print it from every process before training.
    """

    code = "PF201"
    name = "duplicate-rank"
    severity = "error"
    target = "env"

    def evaluate(self, ctx: EnvGroup) -> Iterator[Hit]:
        for var in ("RANK", "RANK_ID"):
            for first, dup, n in repeats(ctx.snapshots, methodcaller("get_int", var)):
                yield Hit(f"{var}={dup.get(var)} is set in {n} processes (also in {first.path})", dup.line, 1, dup.path)

from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, is_shard_point


class ShuffleAfterShard(Check):
    """The dataset is shuffled after it was sharded.

    **Symptom:** each rank only ever shuffles its own fixed slice of the data, so the
    shards keep the file order's bias; per-rank losses differ and the global batch is
    not a random sample.

    **Cause:** `dataset.shard(...)` (or a source read with num_shards and
    shuffle=False) followed by `.shuffle(...)`.

    **Fix:** shuffle first, with a seed shared by all ranks, then shard:
    `dataset.shuffle(buffer_size).shard(num_shards, shard_id)`, or let the source
    shuffle (`shuffle=True` with `num_shards`/`shard_id`).
    """

    code = "PF305"
    name = "shuffle-after-shard"
    severity = "error"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        for c in ctx.calls:
            if c.name != "shuffle" or c.qual is not None or c.receiver is None:
                continue
            shard = next((s for s in ctx.chain(c.receiver, c.node.lineno) if is_shard_point(s)), None)
            if shard is not None:
                yield Hit.at(
                    c.node,
                    f"shuffle after shard (line {shard.node.lineno}): each rank "
                    "shuffles only its own shard; shuffle before sharding",
                )

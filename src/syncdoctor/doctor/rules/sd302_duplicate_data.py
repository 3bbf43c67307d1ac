from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class UnshardedData(Rule):
    """Every rank reads the whole data set in the same order.

    **Symptom:** per-rank losses look normal (identical on every rank), but the
    global batch holds N copies of the same samples (quick-reference table row 2).

    **Cause:** the dataset or loader is not sharded (no DistributedSampler, no
    `dataset.shard(num_shards, shard_id)`), so N cards do the work of one.

    **Quick check:** compare the first batch's sample ids on two ranks.

    **Fix:** shard: `DistributedSampler(dataset, num_replicas=world_size, rank=rank)`
    or `dataset.shard(num_shards=world_size, shard_id=rank)` after the shuffle.
    """

    code = "SD302"
    name = "unsharded-data"
    category = "data.sharding"
    title = "Data not sharded: every rank reads the same batches"
    fix = "Shard the data across ranks (DistributedSampler / dataset.shard(num_shards=world_size, shard_id=rank)) after a common shuffle."
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        fraction, groups = ev.duplicate_batches
        world = ev.world_size or 0
        replicas = {(info or {}).get("num_replicas") for info in ev.snapshot_values("loader").values()}
        if ev.has_records:
            if fraction < 0.5 or not groups or len(groups[0]) < world:
                return None
            evidence = [f"all {world} ranks consumed identical batches at {fraction:.0%} of steps"]
            if replicas <= {1, None}:
                evidence.append("the loader reports no sharding (num_replicas=1)")
                return self.found(0.9, evidence, ranks=ev.ranks)
            return self.found(0.5, evidence, ranks=ev.ranks)
        whole = [g for g in ev.same_data_groups if world and len(g) == world]
        if whole:
            return self.found(0.6 if world > 2 else 0.5,
                              [f"the per-step losses of all {world} ranks move together far beyond chance: "
                               "every rank reads the same batches"], ranks=whole[0])
        return None

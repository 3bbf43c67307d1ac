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

    **Fix:** shard the data across ranks after a common shuffle:
    `DistributedSampler(dataset, num_replicas=world_size, rank=rank)` or
    `dataset.shard(num_shards=world_size, shard_id=rank)`.
    """

    code = "SD302"
    name = "unsharded-data"
    category = "data.sharding"
    stage = "data"
    title = "Data not sharded: every rank reads the same batches"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        fraction, groups = ev.data.duplicate_batches
        world = ev.world_size or 0
        replicas = {(info or {}).get("num_replicas") for info in ev.snapshot_values("loader").values()}
        if ev.has_records:
            if fraction < 0.5 or not groups:
                return None
            if len(groups[0]) < world:
                return self._shards_shared(ev, fraction, groups)
            evidence = [f"all {world} ranks consumed identical batches at {fraction:.0%} of steps"]
            if replicas <= {1, None}:
                evidence.append("the loader reports no sharding (num_replicas=1)")
                return self.found(0.9, evidence, ranks=ev.ranks)
            return self.found(0.5, evidence, ranks=ev.ranks)
        whole = [g for g in ev.loss.same_data_groups if world and len(g) == world]
        if whole:
            return self.found(
                0.6 if world > 2 else 0.5,
                [
                    f"the per-step losses of all {world} ranks move together far beyond chance: "
                    "every rank reads the same batches"
                ],
                ranks=whole[0],
            )
        return None

    def _shards_shared(self, ev: Evidence, fraction: float, groups: list[list[int]]) -> Finding | None:
        """Groups of ranks (not all) read the same batches while each knows its own rank:
        the shard assignment maps several ranks to one shard (a replica group reading
        another group's shard, a shard index taken from the wrong mesh dimension)."""
        from syncdoctor.doctor.rules.sd201_rank_identity import identities_distinct

        shard_ids = [(info or {}).get("rank") for info in ev.snapshot_values("loader").values()]
        known = [s for s in shard_ids if s is not None]
        if len(set(known)) < len(known) or not identities_distinct(ev):
            return None  # a copied rank id explains it: SD201
        shown = "; ".join(", ".join(map(str, g)) for g in groups[:4])
        evidence = [
            f"groups of ranks consumed identical batches at {fraction:.0%} of steps: {shown}",
            "every rank's RANK is distinct: the data shard each rank reads is computed wrong "
            "(several ranks map to one shard, others are never read)",
        ]
        if ev.placement.mesh:
            from syncdoctor.probe.core.mesh import coordinate_of

            coords = [coordinate_of(r, ev.placement.mesh) for r in groups[0]]
            apart = [d for d in ev.placement.mesh["dim_names"] if len({c.get(d) for c in coords}) > 1]
            if apart:
                evidence.insert(
                    0,
                    f"ranks that differ only in mesh dimension {', '.join(apart)} read the same "
                    f"batches, though that dimension shards the data",
                )
        return self.found(
            0.75, evidence, ranks=sorted({r for g in groups for r in g}), step=ev.data.first_duplicate_step
        )

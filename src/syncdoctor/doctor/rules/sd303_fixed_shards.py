from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule


class ShuffleAfterShard(Rule):
    """Each rank reads the same fixed subset every epoch: sharding happens before the shuffle.

        **Symptom:** per-rank data views differ systematically; a rank whose shard is
        a contiguous block of the files keeps seeing one slice of the distribution
    .

        **Cause:** `dataset.shard(...)` (or slicing by rank) runs on the raw file order
        and each rank only shuffles inside its own shard.

        **Quick check:** compare the set of sample ids a rank reads in epoch 1 and epoch 2.

        **Fix:** shuffle globally with a common seed first, then shard:
        `dataset.shuffle(buffer_size, seed).shard(num_shards, shard_id)`; with
        `DistributedSampler(shuffle=True, seed=s)` call `set_epoch(epoch)` every epoch.
    """

    code = "SD303"
    name = "shuffle-after-shard"
    category = "data.sharding"
    stage = "data"
    severity = "warning"
    title = "Shuffle after shard: every rank reads a fixed slice of the data"

    def evaluate(self, ev: Evidence) -> Finding | None:
        overlap = ev.data.sample_overlap
        if overlap is None or overlap["same_subset"] < 0.95 or overlap["cross_overlap"] > 0.02:
            return None
        evidence = [
            f"every rank read the same set of samples in epoch 2 as in epoch 1 (Jaccard ≥ "
            f"{overlap['same_subset']:.2f}); a shuffle before sharding would give a new subset each epoch"
        ]
        offsets = ev.loss.offsets
        if offsets is not None:
            steady = [r for r, t in offsets.t_stat.items() if abs(t) > 6 and offsets.same_sign[r] >= 0.9]
            if steady:
                evidence.append(
                    "its fixed slice shows in the loss: "
                    + ", ".join(f"rank {r} sits {offsets.by_rank[r]:+.0%} from the others" for r in sorted(steady))
                )
        return self.found(0.8, evidence, ranks=ev.ranks)

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import describe_split


class UnseededShuffle(Rule):
    """Ranks shuffle with different random states, so their shards overlap.

    **Symptom:** each rank's batches look normal, but within one epoch ranks read
    some of the same samples and never read others.

    **Cause:** the shuffle before sharding is not seeded identically on every rank
    (no `ds.config.set_seed` / sampler seed, or a per-rank seed such as
    `ds.config.set_seed(seed + rank)` "for augmentation"), so every rank shards a
    different permutation.

    **Quick check:** log the first sample ids of each rank's first batch; under a
    common seed the ranks' shards are disjoint.

    **Fix:** seed the shuffle that precedes sharding identically on every rank
    (`ms.set_seed(s)` and `ds.config.set_seed(s)`, or `DistributedSampler(seed=s)` plus
    `set_epoch(epoch)`), then shard.
    """

    code = "SD301"
    name = "unseeded-shuffle"
    category = "data.seed"
    stage = "data"
    title = "Shards overlap: ranks shuffle with different seeds"

    def evaluate(self, ev: Evidence) -> Finding | None:
        overlap = ev.data.sample_overlap
        fraction, _ = ev.data.duplicate_batches
        if overlap is None or fraction > 0.5 or overlap["cross_overlap"] < 0.02:
            return self._from_settings(ev)
        evidence = [
            f"within the first epoch {overlap['cross_overlap']:.1%} of the samples read were also "
            f"read by another rank (0% under a common shuffle); {overlap['coverage']} distinct samples seen"
        ]
        seeds = ev.differing("loader", "seed")
        # A sampler shuffles with seed + epoch: an epoch set on some ranks only parts the orders too.
        epochs = ev.differing("loader", "epoch")
        if seeds:
            evidence.append("loader seeds differ: " + describe_split(seeds))
        if epochs:
            evidence.append("sampler epochs differ (each seeds the shuffle): " + describe_split(epochs))
        if not (seeds or epochs) and any(v is None for v in ev.snapshot_values("loader", "seed").values()):
            evidence.append("the loader reports no shuffle seed")
        return self.found(0.85, evidence, ranks=ev.ranks)

    def _from_settings(self, ev: Evidence) -> Finding | None:
        """At start, before any sample is read: each rank's sharded source shuffles the
        whole set with a seed of its own, then cuts its shard (a DistributedSampler, torch's
        or MindSpore's, which takes the dataset seed when it is built), so the shards
        overlap. A shuffle after the shard (each rank reorders its own, disjoint part)
        is not it: its sampler does not shuffle."""
        loaders = ev.snapshot_values("loader")
        seeds = {
            r: info["seed"]
            for r, info in loaders.items()
            if isinstance(info, dict)
            and info.get("sampler") == "DistributedSampler"
            and info.get("shuffle") is True
            and isinstance(info.get("num_replicas"), int)
            and info["num_replicas"] > 1
            and isinstance(info.get("seed"), int)
        }
        if len(seeds) < 2 or len(set(seeds.values())) < 2:
            return None
        evidence = [
            "each rank's DistributedSampler shuffles the whole set with its own seed before cutting its shard "
            "(at step 0, before any sample is read): seed "
            + describe_split(seeds)
            + "; the shards overlap and some samples are never read"
        ]
        dataset_seeds = ev.differing("seed", "dataset_seed")
        if dataset_seeds:
            evidence.append("the dataset seeds (ds.config.get_seed()) differ too: " + describe_split(dataset_seeds))
        return self.found(0.85, evidence, ranks=ev.ranks, step=0, direct=True)

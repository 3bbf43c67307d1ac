from __future__ import annotations

from collections import defaultdict

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.rulebook import fmt_ranks

# (variable, whether it is only unique per host)
_IDENTITY_VARS = (("RANK", False), ("RANK_ID", False), ("LOCAL_RANK", True))


class DuplicateRankIdentity(Rule):
    """Two processes believe they are the same rank.

    **Symptom:** two ranks read identical batches and report identical losses; one
    shard of the data is never seen.

    **Cause:** a rank id copied between hosts or launch scripts (RANK_ID, RANK,
    the sampler's rank), so sharding gives two processes the same shard.

    **Quick check:** print RANK/RANK_ID/DEVICE_ID and the sampler's rank on every process at start.

    **Fix:** take every rank id from the launcher only (torchrun's RANK, msrun's
    RANK_ID), never from a copied config, and pass it to the sampler:
    `DistributedSampler(rank=dist.get_rank())` / `dataset.shard(num_shards=world_size,
    shard_id=get_rank())`.
    """

    code = "SD201"
    name = "duplicate-rank-identity"
    category = "config.rank_identity"
    stage = "launch"
    title = "Two processes took the same rank id"
    sources = ("records", "logs")

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence: list[str] = []
        ranks: set[int] = set()
        confidence = 0.0
        for var, per_host in _IDENTITY_VARS:
            seen: dict[tuple[str, str], list[int]] = defaultdict(list)
            for rank, snap in ev.snapshots.items():
                value = (snap.get("env") or {}).get(var)
                if value is not None:
                    seen[(snap.get("host", "") if per_host else "", value)].append(rank)
            for (_, value), owners in seen.items():
                if len(owners) > 1:
                    evidence.append(f"{var}={value} on {fmt_ranks(owners)}")
                    ranks.update(owners)
                    confidence = max(confidence, 0.95)
        loader = ev.snapshot_values("loader")
        shard_ids: dict[int, list[int]] = defaultdict(list)
        for rank, info in loader.items():
            if info and (info.get("num_replicas") or 1) > 1 and info.get("rank") is not None:
                shard_ids[int(info["rank"])].append(rank)
        for shard, owners in shard_ids.items():
            if len(owners) > 1:
                evidence.append(f"the sampler/shard rank is {shard} on {fmt_ranks(owners)}")
                ranks.update(owners)
                confidence = max(confidence, 0.9)
        fraction, groups = ev.data.duplicate_batches
        partial = [g for g in groups if ev.world_size and len(g) < ev.world_size]
        if fraction > 0.5 and (partial or confidence):
            group = partial[0] if partial else groups[0]
            evidence.append(f"{fmt_ranks(group)} consumed identical batches at {fraction:.0%} of steps")
            ranks.update(group)
            if not confidence and identities_distinct(ev):
                # Every process knows its own rank: the shard assignment, not a copied id.
                evidence.append("yet every rank's RANK is distinct: no process took another's id")
                confidence = 0.5
            else:
                confidence = max(confidence, 0.8 if partial else 0.6)
        if not ev.has_records:
            for group in ev.loss.same_data_groups:
                evidence.append(
                    f"{fmt_ranks(group)}: per-step losses move together far beyond chance (the same batches on each)"
                )
                ranks.update(group)
                # All of ≥3 ranks alike points at missing sharding; a pair at a duplicated id.
                whole = ev.world_size is not None and len(group) == ev.world_size > 2
                confidence = max(confidence, 0.45 if whole else 0.6)
        if not confidence:
            return None
        return self.found(confidence, evidence, ranks=sorted(ranks))


def identities_distinct(ev: Evidence) -> bool:
    """Whether every rank recorded a rank variable and no two share it."""
    for var, per_host in _IDENTITY_VARS:
        if per_host:
            continue
        values = [(snap.get("env") or {}).get(var) for snap in ev.snapshots.values()]
        if len(values) > 1 and None not in values and len(set(values)) == len(values):
            return True
    return False

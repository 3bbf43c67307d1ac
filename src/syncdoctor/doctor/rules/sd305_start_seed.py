from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.must_equal import describe
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import describe_split


class StartSeedDiffers(Rule):
    """The ranks print different seeds at start.

    **Symptom:** each rank prints its seed once before training (`dataset seed 1` on
    one, `dataset seed 2` on another; `seed=1234` vs `seed=1235`) and trains without an
    error; the replicas or the data each rank reads quietly differ.

    **Cause:** a seed offset by rank (`seed + rank`, copied from recipes that give
    each worker its own augmentation stream) set where it also drives the shuffle of
    sharded data (the shards then overlap and some samples are never read) or the
    model's initialisation (replicas that start apart where nothing broadcasts them).

    **Quick check:** print the seed the sampler (or the sharded dataset) shuffles with,
    and a checksum of the initial parameters, on every rank.

    **Fix:** seed the model and the sharded shuffle with one seed on every rank; give
    augmentation its own rank-offset generator if you want one.
    """

    code = "SD305"
    name = "start-seed-differs"
    category = "data.seed"
    stage = "data"
    severity = "warning"
    title = "The ranks print different seeds at start"
    sources = ("logs",)

    def evaluate(self, ev: Evidence) -> Finding | None:
        if ev.has_records:
            return None
        p = ev.settings.log_partings.get("seed")
        if p is None:
            return None
        evidence = [
            "every rank printed a seed once before training and they differ: "
            + describe(p, describe_split)
            + (f" ({p.where})" if p.where else ""),
            "a seed that differs by rank is harmless for augmentation only: it parts a sharded "
            "shuffle (overlapping shards) and an initialisation nothing broadcasts",
        ]
        return self.found(0.55, evidence, ranks=[])

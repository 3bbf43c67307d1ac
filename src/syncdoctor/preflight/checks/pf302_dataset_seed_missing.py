from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, literal


class DatasetSeedMissing(Check):
    """A MindSpore dataset shuffles but `ds.config.set_seed` is never called.

    **Symptom:** the ranks' shuffled orders differ, so after sharding their data
    views overlap and miss samples: a sawtooth loss.

    **Cause:** `ms.set_seed` seeds the model RNG, not the dataset pipeline; the
    dataset shuffle has its own seed.

    **Fix:** call `ds.config.set_seed(seed)` with the same seed on every rank before
    building the dataset.
    """

    code = "PF302"
    name = "dataset-seed-missing"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if "mindspore" not in ctx.frameworks or not ctx.data_parallel:
            return
        if {"seed:dataset", "seed:all"} & ctx.project_facts:
            return
        for c in ctx.calls:
            shuffle = c.kw("shuffle")
            source = (
                c.under("mindspore.dataset")
                and c.name.endswith("Dataset")
                and (shuffle is None or literal(shuffle.value) not in (False, None))
            )
            method = c.name == "shuffle" and c.qual is None and c.receiver is not None and c.kw("seed") is None
            if source or method:
                yield Hit.at(
                    c.node,
                    "dataset shuffles without a dataset seed: call "
                    "ds.config.set_seed(seed) with the same seed on every rank",
                )
                return

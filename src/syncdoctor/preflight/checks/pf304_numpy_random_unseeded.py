from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext, literal

GENERATORS = frozenset({"default_rng", "RandomState", "Generator"})
NOT_SAMPLING = frozenset(
    {"seed", "get_state", "set_state", "SeedSequence", "PCG64", "MT19937", "Philox", "SFC64", "BitGenerator"}
)


class NumpyRandomUnseeded(Check):
    """A data-parallel script draws from NumPy's RNG without a seed.

    **Symptom:** index permutations that differ per rank and per run: shards overlap
    and miss samples, or the data order cannot be reproduced.

    **Cause:** `np.random.*` without `np.random.seed`, or `np.random.default_rng()`
    / `RandomState()` created without a seed (those ignore the global seed).

    **Fix:** seed once with `np.random.seed(seed)` or pass a seed to `default_rng(seed)`.
    """

    code = "PF304"
    name = "numpy-random-unseeded"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if not ctx.data_parallel:
            return
        seeded = bool({"seed:numpy", "seed:all"} & ctx.project_facts)
        reported_global = False
        for c in ctx.calls:
            if c.qual != f"numpy.random.{c.name}" or c.name in NOT_SAMPLING:
                continue
            if c.name in GENERATORS:
                seed = c.arg(0, "seed")
                if seed is None or literal(seed) is None:
                    yield Hit.at(
                        c.node, f"np.random.{c.name}() without a seed draws fresh OS entropy on every rank: pass a seed"
                    )
            elif not seeded and not reported_global:
                reported_global = True
                yield Hit.at(
                    c.node,
                    f"np.random.{c.name}() is used but NumPy is never seeded: call np.random.seed(seed) at start-up",
                )

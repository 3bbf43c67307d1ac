from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit
from syncdoctor.preflight.script import ScriptContext

RANDOM_FUNCS = frozenset(
    {
        "random",
        "randint",
        "randrange",
        "choice",
        "choices",
        "shuffle",
        "sample",
        "uniform",
        "gauss",
        "normalvariate",
        "triangular",
        "betavariate",
        "getrandbits",
        "randbytes",
    }
)


class PythonRandomUnseeded(Check):
    """A data-parallel script uses Python's `random` module without `random.seed`.

    **Symptom:** per-rank shuffles or augmentations that differ from run to run;
    a hand-made shuffle before sharding gives each rank a different permutation, so
    shards overlap and miss samples.

    **Cause:** the `random` module is seeded from the OS unless `random.seed` is called.

    **Fix:** call `random.seed(seed)` at start-up (the same seed on every rank where
    the order must agree).
    """

    code = "PF303"
    name = "python-random-unseeded"
    severity = "warning"
    target = "script"

    def evaluate(self, ctx: ScriptContext) -> Iterator[Hit]:
        if not ctx.data_parallel or {"seed:python", "seed:all"} & ctx.project_facts:
            return
        for c in ctx.calls:
            if c.qual == f"random.{c.name}" and c.name in RANDOM_FUNCS:
                yield Hit.at(
                    c.node,
                    f"random.{c.name}() is used but the random module is never "
                    "seeded: call random.seed(seed) at start-up",
                )
                return

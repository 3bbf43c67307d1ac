from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.environment import EnvGroup
from syncdoctor.preflight.model import Hit


class WorldSizeMismatch(Check):
    """WORLD_SIZE / RANK_SIZE disagree between processes, with each other, or with
    the ranks present.

    **Symptom:** the process group never forms (ranks wait for different sizes), or
    data is sharded by one size and reduced by another.

    **Cause:** per-node launch scripts with a hard-coded size, or RANK_SIZE and
    WORLD_SIZE set from different sources.

    **Fix:** set one size for the whole job from one place and export both names
    from it; RANK must be below it.
    """

    code = "PF203"
    name = "world-size-mismatch"
    severity = "error"
    target = "env"

    def evaluate(self, ctx: EnvGroup) -> Iterator[Hit]:
        snaps = ctx.snapshots
        for var in ("WORLD_SIZE", "RANK_SIZE"):
            values = Counter(s.get(var) for s in snaps if s.get(var) is not None)
            if len(values) > 1:
                common = values.most_common(1)[0][0]
                for s in snaps:
                    if s.get(var) not in (None, common):
                        yield Hit(
                            f"{var}={s.get(var)} here but {var}={common} in {values[common]} other processes",
                            s.line,
                            1,
                            s.path,
                        )
        for s in snaps:
            world, rank_size = s.get_int("WORLD_SIZE"), s.get_int("RANK_SIZE")
            size = world if world is not None else rank_size
            if world is not None and rank_size is not None and world != rank_size:
                yield Hit(f"WORLD_SIZE={world} but RANK_SIZE={rank_size} in the same process", s.line, 1, s.path)
            for var in ("RANK", "RANK_ID"):
                rank = s.get_int(var)
                if size is not None and rank is not None and not 0 <= rank < size:
                    yield Hit(f"{var}={rank} is outside 0..{size - 1} for a world of {size}", s.line, 1, s.path)
        sizes = [s.get_int("WORLD_SIZE", "RANK_SIZE") for s in snaps]
        known = [n for n in sizes if n is not None]
        if known and len(snaps) > max(known):
            yield Hit(f"{len(snaps)} processes reported but the world size is {max(known)}", 1, 1, snaps[-1].path)

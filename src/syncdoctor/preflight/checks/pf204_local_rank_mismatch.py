from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks._common import repeats, visible_devices
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.environment import EnvGroup
from syncdoctor.preflight.model import Hit


class LocalRankMismatch(Check):
    """LOCAL_RANK does not map to a device of its node: repeated on one node, or
    beyond LOCAL_WORLD_SIZE or the visible devices.

    **Symptom:** `cuda:{LOCAL_RANK}` / `set_device(LOCAL_RANK)` puts two processes on
    one card or fails with an invalid device ordinal on one node only.

    **Cause:** a node launched with the wrong number of processes per node, or
    CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES listing fewer cards.

    **Fix:** start one process per visible card and let the launcher set LOCAL_RANK.
    """

    code = "PF204"
    name = "local-rank-mismatch"
    severity = "error"
    target = "env"

    def evaluate(self, ctx: EnvGroup) -> Iterator[Hit]:
        with_local = [s for s in ctx.snapshots if s.get_int("LOCAL_RANK") is not None]
        for first, dup, n in repeats(with_local, lambda s: (s.node, s.get_int("LOCAL_RANK"))):
            node = "" if first.node == "?" else f" on {first.node}"
            yield Hit(
                f"LOCAL_RANK={dup.get('LOCAL_RANK')} is set in {n} processes{node} (also in {first.path})",
                dup.line,
                1,
                dup.path,
            )
        for s in with_local:
            local = s.get_int("LOCAL_RANK")
            assert local is not None
            local_world = s.get_int("LOCAL_WORLD_SIZE")
            visible = visible_devices(s)
            if local_world is not None and not 0 <= local < local_world:
                yield Hit(
                    f"LOCAL_RANK={local} is outside 0..{local_world - 1} (LOCAL_WORLD_SIZE={local_world})",
                    s.line,
                    1,
                    s.path,
                )
            elif visible is not None and len(visible) > 1 and not 0 <= local < len(visible):
                yield Hit(
                    f"LOCAL_RANK={local} but only {len(visible)} devices are visible ({','.join(visible)})",
                    s.line,
                    1,
                    s.path,
                )

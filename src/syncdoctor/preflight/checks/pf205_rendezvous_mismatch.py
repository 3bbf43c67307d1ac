from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.environment import EnvGroup
from syncdoctor.preflight.model import Hit

RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "MS_SCHED_HOST", "MS_SCHED_PORT")


class RendezvousMismatch(Check):
    """MASTER_ADDR / MASTER_PORT (MS_SCHED_HOST / MS_SCHED_PORT) differ between processes.

    **Symptom:** the processes form two separate groups or wait forever at
    init_process_group / init(); a timeout that looks like a network fault.

    **Cause:** per-node scripts that use their own address as the master, or a
    port chosen at random on each node.

    **Fix:** take the master address and port from one place (the launcher, or the
    first node) for every process of the job.
    """

    code = "PF205"
    name = "rendezvous-mismatch"
    severity = "error"
    target = "env"

    def evaluate(self, ctx: EnvGroup) -> Iterator[Hit]:
        for var in RENDEZVOUS:
            values = Counter(s.get(var) for s in ctx.snapshots if s.get(var) is not None)
            if len(values) < 2:
                continue
            common, count = values.most_common(1)[0]
            for s in ctx.snapshots:
                value = s.get(var)
                if value is not None and value != common:
                    yield Hit(f"{var}={value} here but {var}={common} in {count} other processes", s.line, 1, s.path)

from __future__ import annotations

from syncdoctor.doctor.evidence import Evidence
from syncdoctor.doctor.model import Finding
from syncdoctor.doctor.rules.base import Rule
from syncdoctor.records.compare import majority_outliers


class CodeVersionMismatch(Rule):
    """Nodes run different code or library versions.

    **Symptom:** any of the silent mismatches (loss offsets, parted replicas)
    appearing after a deployment, often only on some nodes.

    **Cause:** the training script, the user's modules or the framework/comm
    library versions differ across nodes.

    **Quick check:** `syncdoctor preflight --manifest` on every node, then `--compare`.

    **Fix:** deploy one immutable code package / container image to every node;
    `syncdoctor preflight --manifest` on each node and `--compare` show what differs.
    """

    code = "SD801"
    name = "code-version-mismatch"
    category = "code.version_mismatch"
    stage = "launch"
    title = "Code or library versions differ across ranks"

    def evaluate(self, ev: Evidence) -> Finding | None:
        evidence = []
        ranks: set[int] = set()
        for label, path in (("entry script", ("code", "entry_sha256")), ("versions", ("versions",))):
            values = ev.differing(*path)
            if values:
                odd = majority_outliers({r: repr(v) for r, v in values.items()})
                ranks.update(odd)
                evidence.append(
                    f"{label} differ on ranks {odd}" + (f": {values[odd[0]]}" if label == "versions" else "")
                )
        files = ev.snapshot_values("code", "files")
        names = {n for v in files.values() if v for n in v}
        changed = sorted(n for n in names if len({(files[r] or {}).get(n) for r in files}) > 1)
        if changed:
            evidence.append(f"{len(changed)} source files differ across ranks, e.g. {', '.join(changed[:3])}")
        if not evidence:
            return None
        return self.found(0.9, evidence, ranks=sorted(ranks))

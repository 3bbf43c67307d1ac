from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.manifest import Manifest
from syncdoctor.preflight.model import Hit


class FileHashDiffers(Check):
    """A source file has different contents on different nodes.

    **Symptom:** looks like a communication fault: the ranks of one node compute a
    different loss (e.g. ASL margin 0.05 there, 0.1 elsewhere) and the averaged
    gradient points nowhere.

    **Cause:** a node kept an older copy of the code, or someone edited it in place.

    **Fix:** sync the code from one source and check that the manifests agree.
    """

    code = "PF402"
    name = "file-hash-differs"
    severity = "error"
    target = "manifest"

    def evaluate(self, ctx: list[Manifest]) -> Iterator[Hit]:
        every = sorted(set().union(*(m.files for m in ctx)))
        for name in every:
            hashes = Counter(m.files[name] for m in ctx if name in m.files)
            if len(hashes) < 2:
                continue
            common = hashes.most_common(1)[0][0]
            odd = [m for m in ctx if m.files.get(name) not in (None, common)]
            yield Hit(
                f"{name} differs: sha256 {odd[0].files[name][:12]} on "
                f"{', '.join(m.label for m in odd)} vs {common[:12]} on "
                f"{hashes[common]} other node(s)",
                1,
                1,
                odd[0].path,
            )

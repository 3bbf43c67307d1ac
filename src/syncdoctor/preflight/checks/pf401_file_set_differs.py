from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.manifest import Manifest
from syncdoctor.preflight.model import Hit


class FileSetDiffers(Check):
    """A source file exists on some nodes only.

    **Symptom:** ranks import different code (a module found on one node, a stale
    copy shadowing it on another): per-rank behaviour differs with no error.

    **Cause:** a code package synced to some nodes only, or a file added after the
    last sync.

    **Fix:** distribute the code from one place (shared storage, an image, one
    rsync) and compare manifests before starting.
    """

    code = "PF401"
    name = "file-set-differs"
    severity = "error"
    target = "manifest"

    def evaluate(self, ctx: list[Manifest]) -> Iterator[Hit]:
        every = sorted(set().union(*(m.files for m in ctx)))
        for name in every:
            having = [m for m in ctx if name in m.files]
            if len(having) == len(ctx):
                continue
            missing = [m for m in ctx if name not in m.files]
            yield Hit(f"{name} exists on {_labels(having)} but not on {_labels(missing)}", 1, 1, missing[0].path)


def _labels(ms: list[Manifest]) -> str:
    names = [m.label for m in ms]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")

from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.manifest import Manifest
from syncdoctor.preflight.model import Hit


class PythonVersionDiffers(Check):
    """The Python version differs between nodes.

    **Symptom:** pickled objects, hash seeds, or package builds differ by node;
    different wheels of the same package get installed.

    **Cause:** nodes built from different images or environments.

    **Fix:** run every node from the same environment or image.
    """

    code = "PF404"
    name = "python-version-differs"
    severity = "error"
    target = "manifest"

    def evaluate(self, ctx: list[Manifest]) -> Iterator[Hit]:
        known = [m for m in ctx if m.python]
        if len({m.python for m in known}) > 1:
            odd = next(m for m in known if m.python != known[0].python)
            listing = ", ".join(f"{m.label} {m.python}" for m in known[:6])
            yield Hit(f"Python version differs: {listing}", 1, 1, odd.path)

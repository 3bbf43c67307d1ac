from __future__ import annotations

from collections.abc import Iterator

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.manifest import Manifest
from syncdoctor.preflight.model import Hit


class PackageVersionDiffers(Check):
    """An installed package has different versions (or is missing) on some nodes.

    **Symptom:** numerics, defaults or collective implementations differ between
    nodes (a torch, NCCL or MindSpore minor version apart): silent drift or hangs.

    **Cause:** nodes set up at different times, or a `pip install -U` on one node.

    **Fix:** install from one pinned requirements file or one container image.
    """

    code = "PF403"
    name = "package-version-differs"
    severity = "error"
    target = "manifest"

    def evaluate(self, ctx: list[Manifest]) -> Iterator[Hit]:
        every = sorted(set().union(*(m.packages for m in ctx)))
        for name in every:
            versions = [m.packages.get(name, "(absent)") for m in ctx]
            if len(set(versions)) > 1:
                odd = next(m for m in ctx[1:] if m.packages.get(name) != ctx[0].packages.get(name))
                listing = ", ".join(f"{m.label} {v}" for m, v in list(zip(ctx, versions, strict=True))[:6])
                yield Hit(f"package {name} differs: {listing}", 1, 1, odd.path)

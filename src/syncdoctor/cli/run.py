"""`syncdoctor run [--out DIR] -- CMD...`: registered, parsed and run by
`syncdoctor.probe.cli` for now (its launcher machinery lives there too)."""

from __future__ import annotations

from syncdoctor.probe.cli import register

__all__ = ["register"]

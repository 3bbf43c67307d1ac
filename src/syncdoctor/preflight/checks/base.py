"""The check base class. A check is one small unit, as a doctor rule is
(doctor/rules/base.py): a stable code, a name, a severity, the `target` it reads,
a docstring whose **Symptom:**, **Cause:** and **Fix:** sections are its docs, and
one `evaluate` method that yields a Hit per problem."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from syncdoctor.preflight.model import Hit, Target
from syncdoctor.rulebook import Entry


class Check(Entry):
    """One preflight check. Subclasses set the metadata, document themselves with
    **Symptom:**, **Cause:** and **Fix:** sections (that text is the documentation
    `syncdoctor rules` and `--explain` print) and implement `evaluate`."""

    target: ClassVar[Target]
    # The runner reports the inputs of `target` that could not be parsed as this
    # check's findings (PF100, PF300).
    reports_unreadable: ClassVar[bool] = False

    @classmethod
    def docs(cls) -> dict[str, Any]:
        sections = super().docs()
        return {
            "code": cls.code,
            "name": cls.name,
            "category": cls.target,
            "severity": cls.severity,
            "title": sections["summary"],
            **sections,
        }

    def evaluate(self, ctx: Any) -> Iterable[Hit]:
        """Yield one Hit per problem found in `ctx` (the context type of `target`)."""
        raise NotImplementedError

from __future__ import annotations

from collections.abc import Iterable

from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.model import Hit


class ScriptUnparsable(Check):
    """A Python file could not be parsed, so no script check ran on it.

    **Symptom:** none yet: this file was not checked.

    **Cause:** a syntax error, Python 2 code, or syntax newer than the Python that
    runs syncdoctor.

    **Fix:** fix the syntax, or run syncdoctor with the Python the job uses.
    """

    code = "PF300"
    name = "script-unparsable"
    severity = "warning"
    target = "script"
    reports_unreadable = True  # the runner reports what could not be parsed

    def evaluate(self, ctx: object) -> Iterable[Hit]:
        return ()

"""What a preflight check is and what it reports. Plain data plus the base class
every check derives from; the checks themselves live one per file in `checks/`."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

Severity = Literal["error", "warning", "info"]
Target = Literal["script", "rank_table", "env", "manifest"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
TARGETS: tuple[Target, ...] = ("script", "rank_table", "env", "manifest")


@dataclass(frozen=True, order=True)
class PreflightFinding:
    path: str
    line: int
    col: int
    code: str
    severity: Severity
    message: str

    def render(self) -> str:
        """One ruff-style line: `path:line:col CODE message`."""
        return f"{self.path}:{self.line}:{self.col} {self.code} {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Hit:
    """What a check yields: the runner adds the code and severity of the check."""

    message: str
    line: int = 1
    col: int = 1
    path: str | None = None  # None: the path of the context the check was given

    @classmethod
    def at(cls, node: ast.AST, message: str) -> Hit:
        return cls(message, getattr(node, "lineno", 1), getattr(node, "col_offset", 0) + 1)


class Check:
    """One preflight check. Subclasses set the metadata, document themselves with
    **Symptom:**, **Cause:** and **Fix:** sections (that text is the documentation
    `syncdoctor rules` and `--explain` print) and implement `evaluate`."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    target: ClassVar[Target]

    def evaluate(self, ctx: Any) -> Iterable[Hit]:
        """Yield one Hit per problem found in `ctx` (the context type of `target`)."""
        raise NotImplementedError

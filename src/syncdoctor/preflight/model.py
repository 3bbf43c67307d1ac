"""What a preflight check reports: plain data. The base class every check derives
from is `checks/base.py`; the checks themselves live one per file in `checks/`."""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass
from typing import Any, Literal

from syncdoctor.rulebook import Severity

Target = Literal["script", "rank_table", "env", "manifest"]
# C0/C1 controls, DEL and the bidirectional overrides, written as Python escapes.
_ESCAPES = {
    c: ascii(chr(c))[1:-1] for c in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A))
}


@dataclass(frozen=True, order=True)
class PreflightFinding:
    path: str
    line: int
    col: int
    code: str
    severity: Severity
    message: str

    def render(self) -> str:
        """One ruff-style line: `path:line:col CODE message`. Messages quote the
        inputs (a server_id, a device_ip), so control characters are shown escaped:
        a hostile rank table must not break the line or drive the terminal."""
        return f"{self.path}:{self.line}:{self.col} {self.code} {self.message}".translate(_ESCAPES)

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

"""What each kind of check is given: the contexts the engine builds from the inputs.
Checks import their context from here (or from the module that defines it:
`script.ScriptContext`, `environment.EnvGroup`, `manifest.Manifest`), never the
engine that discovers and runs them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from syncdoctor.preflight.environment import EnvGroup
from syncdoctor.preflight.rank_table import RankTable


@dataclass
class Unparsable:
    """A script, rank table or manifest that could not be read; PF100/PF300 report it."""

    path: str
    message: str
    line: int = 1
    col: int = 1


@dataclass
class RankTableContext:
    """One rank table, with the environment snapshots found beside it and the
    launching shell's environment (when given) to hold it against."""

    table: RankTable
    env_groups: list[EnvGroup] = field(default_factory=list)
    environ: Mapping[str, str] | None = None

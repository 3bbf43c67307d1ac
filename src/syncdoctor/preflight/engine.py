"""run_preflight: find the inputs under the given paths, build one context per
input, run every check on the contexts of its target, and drop suppressed findings."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncdoctor.errors import InputError
from syncdoctor.preflight.checks.base import Check
from syncdoctor.preflight.contexts import RankTableContext, Unparsable
from syncdoctor.preflight.environment import (
    EnvGroup,
    EnvInputError,
    group_snapshots,
    is_env_dump,
    is_record_file,
)
from syncdoctor.preflight.manifest import (
    SKIP_DIRS,
    Manifest,
    ManifestError,
    load_manifest,
    manifests_from_records,
)
from syncdoctor.preflight.model import Hit, PreflightFinding, Target
from syncdoctor.preflight.rank_table import (
    RankTableError,
    load_rank_table,
    looks_like_rank_table,
)
from syncdoctor.preflight.registry import all_checks
from syncdoctor.preflight.script import ScriptContext

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.I)


class PreflightInputError(InputError, ValueError):
    """A path that does not exist or an input that must be refused: exit code 2."""


@dataclass
class Inputs:
    scripts: list[ScriptContext] = field(default_factory=list)
    rank_tables: list[RankTableContext] = field(default_factory=list)
    env_groups: list[EnvGroup] = field(default_factory=list)
    manifests: list[list[Manifest]] = field(default_factory=list)  # each list is compared
    unreadable: dict[Target, list[Unparsable]] = field(default_factory=dict)

    def contexts(self, target: Target) -> list[Any]:
        by_target: dict[Target, list[Any]] = {
            "script": self.scripts,
            "rank_table": self.rank_tables,
            "env": self.env_groups,
            "manifest": self.manifests,
        }
        return by_target[target]


def iter_files(paths: Iterable[str | Path]) -> Iterable[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            yield path
        elif path.is_dir():
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
                for name in sorted(files):
                    yield Path(root) / name
        else:
            raise PreflightInputError(f"{raw}: no such file or folder")


def collect(
    paths: Sequence[str | Path],
    rank_table: str | Path | None = None,
    compare: Sequence[str | Path] = (),
    environ: Mapping[str, str] | None = None,
) -> Inputs:
    inputs = Inputs()
    env_files: list[Path] = []
    table_files: list[Path] = []
    for path in iter_files(paths):
        suffix = path.suffix.lower()
        if suffix == ".py":
            _add_script(inputs, path)
        elif suffix == ".json" and _sniff(path):
            table_files.append(path)
        elif is_env_dump(path) or is_record_file(path):
            env_files.append(path)
    if rank_table is not None:
        if not Path(rank_table).is_file():
            raise PreflightInputError(f"{rank_table}: no such rank-table file")
        if Path(rank_table) not in table_files:
            table_files.append(Path(rank_table))
    try:
        inputs.env_groups = group_snapshots(env_files)
    except EnvInputError as exc:
        raise PreflightInputError(str(exc)) from None
    for path in table_files:
        try:
            table = load_rank_table(path)
        except RankTableError as exc:
            inputs.unreadable.setdefault("rank_table", []).append(Unparsable(str(path), str(exc), *exc.pos))
            continue
        inputs.rank_tables.append(RankTableContext(table, inputs.env_groups, environ))
    for group in inputs.env_groups:
        from_records = manifests_from_records(group.snapshots)
        if len(from_records) > 1:
            inputs.manifests.append(from_records)
    if compare:
        try:
            inputs.manifests.append([load_manifest(p) for p in compare])
        except ManifestError as exc:
            raise PreflightInputError(str(exc)) from None
    _share_facts(inputs.scripts)
    return inputs


def _sniff(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8", errors="replace") as fh:
            return looks_like_rank_table(fh.read(65536))
    except OSError:
        return False


def _add_script(inputs: Inputs, path: Path) -> None:
    try:
        source = path.read_text(encoding="utf-8", errors="replace")
        inputs.scripts.append(ScriptContext.parse(str(path), source))
    except SyntaxError as exc:
        inputs.unreadable.setdefault("script", []).append(
            Unparsable(str(path), f"syntax error: {exc.msg}", exc.lineno or 1, exc.offset or 1)
        )
    except (OSError, ValueError) as exc:  # ValueError: null bytes in the source
        inputs.unreadable.setdefault("script", []).append(Unparsable(str(path), str(exc)))


def _share_facts(scripts: list[ScriptContext]) -> None:
    """A seed set or a context configured in one file holds for the whole process."""
    union: set[str] = set().union(*(s.facts for s in scripts)) if scripts else set()
    for s in scripts:
        s.project_facts = union


def _noqa_codes(source_line: str) -> set[str] | None:
    """None: no noqa; empty set: a bare `# noqa`; else the codes named."""
    m = _NOQA.search(source_line)
    if m is None:
        return None
    codes = m.group("codes")
    return {c.strip().upper() for c in codes.split(",")} if codes else set()


def _suppressed(finding: PreflightFinding, lines_by_path: Mapping[str, list[str]]) -> bool:
    lines = lines_by_path.get(finding.path)
    if not lines or not 1 <= finding.line <= len(lines):
        return False
    codes = _noqa_codes(lines[finding.line - 1])
    return codes is not None and (not codes or finding.code in codes)


def _selected(check: type[Check], select: Sequence[str] | None, ignore: Sequence[str]) -> bool:
    code = check.code
    if any(code.startswith(p.upper()) for p in ignore):
        return False
    return select is None or any(code.startswith(p.upper()) for p in select)


def evaluate(inputs: Inputs, select: Sequence[str] | None = None, ignore: Sequence[str] = ()) -> list[PreflightFinding]:
    findings: list[PreflightFinding] = []
    for check_cls in all_checks():
        if not _selected(check_cls, select, ignore):
            continue
        check = check_cls()
        for ctx in inputs.contexts(check_cls.target):
            default_path = _context_path(ctx)
            for hit in check.evaluate(ctx):
                findings.append(_finding(check_cls, hit, default_path))
        if check_cls.reports_unreadable:
            for bad in inputs.unreadable.get(check_cls.target, []):
                hit = Hit(bad.message, bad.line, bad.col, bad.path)
                findings.append(_finding(check_cls, hit, bad.path))
    lines = {s.path: s.source.splitlines() for s in inputs.scripts}
    return sorted({f for f in findings if not _suppressed(f, lines)})


def _finding(check: type[Check], hit: Hit, default_path: str) -> PreflightFinding:
    return PreflightFinding(
        hit.path or default_path, max(hit.line, 1), max(hit.col, 1), check.code, check.severity, hit.message
    )


def _context_path(ctx: Any) -> str:
    if isinstance(ctx, ScriptContext):
        return ctx.path
    if isinstance(ctx, RankTableContext):
        return ctx.table.path
    if isinstance(ctx, EnvGroup):
        return ctx.root
    return ctx[0].path if ctx else ""


def run_preflight(
    paths: Sequence[str | Path],
    rank_table: str | Path | None = None,
    *,
    compare: Sequence[str | Path] = (),
    environ: Mapping[str, str] | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
) -> list[PreflightFinding]:
    """Check the scripts, rank tables, environment snapshots and manifests found
    under `paths` (files or folders). `environ`: the launch environment to hold the
    rank table against (RANK_SIZE); `compare`: manifests written on each node.
    Raises PreflightInputError for a missing path or a refused record file."""
    return evaluate(collect(paths, rank_table, compare, environ), select, ignore)

"""`syncdoctor preflight [PATH...]`: rank tables, environments and training scripts
checked before the job starts (the work: syncdoctor.preflight); findings as
`path:line:col CODE message` or JSON, exit 1 when an error-level check fires."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from syncdoctor.cli.options import add_json
from syncdoctor.errors import InputError
from syncdoctor.preflight.model import PreflightFinding
from syncdoctor.rulebook import SEVERITIES

if TYPE_CHECKING:
    from syncdoctor.preflight.engine import Inputs

EXIT_CLEAN, EXIT_ERRORS = 0, 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "preflight",
        help="check rank tables, environments and training scripts before the job starts",
        description=(
            "Check training scripts (*.py), HCCL rank tables (*.json, found by content), "
            "per-rank environment dumps (*.env, env*.txt) and probe run folders "
            "(records/rank*.jsonl) for mistakes that break data-parallel training. "
            "Prints `path:line:col CODE message`; exit 1 when an error-level check fires. "
            "Suppress one finding with `# noqa: PF3xx` on its line."
        ),
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or folders to check (default: the current folder, unless "
        "--rank-table or --compare says what to check)",
    )
    p.add_argument("--rank-table", metavar="FILE", help="the HCCL rank table the job will use")
    add_json(p, "print the findings as a JSON list")
    p.add_argument("--select", metavar="CODES", help="comma-separated codes or prefixes to run")
    p.add_argument("--ignore", metavar="CODES", help="comma-separated codes or prefixes to skip")
    p.add_argument(
        "--no-environ", action="store_true", help="do not hold the rank table against this shell's RANK_SIZE"
    )
    p.add_argument(
        "--manifest", metavar="OUT", help="write a hash manifest of the code under PATH and the installed packages"
    )
    p.add_argument(
        "--compare", nargs="+", metavar="MANIFEST", help="compare manifests written on each node (two or more)"
    )
    p.add_argument("--list", action="store_true", help="list the preflight checks")
    p.add_argument("--explain", metavar="CODE", help="print the documentation of one check")
    p.set_defaults(func=cmd_preflight)


def _codes(text: str | None) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()] if text else []


def cmd_preflight(args: argparse.Namespace) -> int:
    from syncdoctor.preflight.engine import collect, evaluate
    from syncdoctor.preflight.manifest import write_manifest
    from syncdoctor.preflight.registry import all_checks, get_check

    if args.list:
        for check in all_checks():
            print(f"{check.code}  {check.severity:<7}  {check.target:<10}  {check.name}")
        return EXIT_CLEAN
    if args.explain:
        explained = get_check(args.explain)
        if explained is None:
            raise InputError(f"unknown preflight code {args.explain!r} (see --list)")
        print(f"{explained.code} {explained.name} ({explained.severity}, {explained.target})\n")
        print(_dedent_doc(explained.__doc__ or ""))
        return EXIT_CLEAN
    paths = args.paths or ["."]
    if args.manifest:
        missing = [p for p in paths if not os.path.exists(p)]
        if missing:
            raise InputError(f"{missing[0]}: no such file or folder")
        data = write_manifest(args.manifest, paths)
        print(f"wrote {args.manifest}: {len(data['files'])} files, {len(data['packages'])} packages")
        return EXIT_CLEAN
    if args.compare is not None and len(args.compare) < 2:
        raise InputError("--compare needs at least two manifests")
    # With --rank-table or --compare and no PATH, only what was named is checked,
    # never the current folder's other files.
    if (args.compare or args.rank_table) and not args.paths:
        paths = []
    # A PreflightInputError is an InputError: one line, exit code 2.
    inputs = collect(paths, args.rank_table, args.compare or (), None if args.no_environ else os.environ)
    findings = evaluate(inputs, _codes(args.select) or None, _codes(args.ignore))
    _print(findings, args.json)
    if not findings and not args.json:
        print(_clean_line(inputs, paths))
    return EXIT_ERRORS if any(f.severity == "error" for f in findings) else EXIT_CLEAN


def _clean_line(inputs: Inputs, paths: list[str]) -> str:
    """What was checked, when nothing was found: a clean run says so."""
    counts = [
        (len(inputs.scripts), "script", "scripts"),
        (len(inputs.rank_tables), "rank table", "rank tables"),
        (len(inputs.env_groups), "environment group", "environment groups"),
        (len(inputs.manifests), "set of manifests", "sets of manifests"),
    ]
    checked = [f"{n} {one if n == 1 else many}" for n, one, many in counts if n]
    if not checked:
        where = ", ".join(paths) or "the inputs given"
        return (
            f"nothing to check in {where}: no training scripts (*.py), rank tables (*.json), "
            "environment dumps or probe records"
        )
    return f"no problems found ({', '.join(checked)} checked)"


def _print(findings: list[PreflightFinding], as_json: bool) -> None:
    if as_json:
        json.dump([f.to_dict() for f in findings], sys.stdout, indent=1)
        print()
        return
    for f in findings:
        print(f.render())
    if findings:
        counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
        summary = ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
        print(f"Found {len(findings)} problem{'s' if len(findings) != 1 else ''} ({summary}).", file=sys.stderr)


def _dedent_doc(doc: str) -> str:
    import inspect

    return inspect.cleandoc(doc)

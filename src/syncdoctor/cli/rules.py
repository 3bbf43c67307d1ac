"""`syncdoctor rules [CODE]`: every diagnosis rule (SD...) and preflight check (PF...),
or one in full, from the docstrings that are their documentation (rulebook.py)."""

from __future__ import annotations

import argparse
import json

from syncdoctor.cli.options import add_json
from syncdoctor.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser(
        "rules",
        help="list the diagnosis rules and preflight checks with their docs",
        description="Every diagnosis rule (SD...) and preflight check (PF...): code, "
        "category, severity and title; with CODE, its whole documentation "
        "(symptom, cause, quick check, fix).",
    )
    r.add_argument("code", nargs="?", help="show one rule or check in full")
    add_json(r, "print the documentation as JSON")
    r.set_defaults(func=cmd_rules)


def all_rule_docs() -> list[dict]:
    from syncdoctor.doctor.rules import all_rules
    from syncdoctor.preflight.registry import all_checks

    return [dict(rule.docs(), kind="diagnosis") for rule in all_rules()] + [
        dict(check.docs(), kind="preflight") for check in all_checks()
    ]


def cmd_rules(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    docs = all_rule_docs()
    if args.code:
        docs = [d for d in docs if d["code"].upper() == args.code.upper()]
        if not docs:
            raise InputError(f"no rule or check with code {args.code}")
    if args.json:
        print(json.dumps(docs, indent=1, ensure_ascii=False))
        return 0
    console = Console()
    if args.code:
        for key, value in docs[0].items():
            console.print(f"[bold]{key}[/bold]: ", end="")
            console.print(str(value), markup=False)
        return 0
    table = Table(title="syncdoctor rules (diagnosis SD…, preflight PF…)")
    for column in ("code", "kind", "category", "severity", "title"):
        table.add_column(column)
    for d in docs:
        table.add_row(d["code"], d["kind"], d["category"], d["severity"], d["title"])
    console.print(table)
    return 0

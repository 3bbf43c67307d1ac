"""The `syncdoctor` parser and `main`: one module per command registers its
subcommand (`register(sub)`), in the order the help lists them; this file only wires
them together and turns an InputError into one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from syncdoctor.cli.options import EXIT_USAGE, Parser
from syncdoctor.errors import InputError


def build_parser() -> argparse.ArgumentParser:
    from syncdoctor import __version__
    from syncdoctor.cli import demo, diagnose, experiment, export, lab, preflight, rules, run

    parser = Parser(
        prog="syncdoctor",
        description="Find why data-parallel training goes wrong only on many cards.",
        epilog="Start with `syncdoctor demo`; `syncdoctor COMMAND --help` tells more.",
    )
    parser.add_argument("--version", action="version", version=f"syncdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in (lab, demo, run, diagnose, rules, experiment, export, preflight):
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"syncdoctor: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("syncdoctor: interrupted", file=sys.stderr)
        return 130

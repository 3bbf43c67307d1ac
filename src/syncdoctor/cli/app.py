"""The `syncdoctor` parser and `main`: one module per command registers its
subcommand (`register(sub)`), in the order the help lists them; this file only wires
them together and turns an InputError into one line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from syncdoctor.cli.options import EXIT_USAGE, Parser
from syncdoctor.errors import InputError

# The command modules, in the order the help lists them.
COMMANDS = ("lab", "demo", "run", "diagnose", "rules", "experiment", "export", "preflight")


def _command_modules(only: str | None) -> list[ModuleType]:
    # `syncdoctor run` starts before every training job it watches: the other commands'
    # modules (the doctor, the lab, the reports) would cost it about 35 ms to import.
    from syncdoctor.cli import run

    if only == "run":
        return [run]
    from syncdoctor.cli import demo, diagnose, experiment, export, lab, preflight, rules

    modules = dict(zip(COMMANDS, (lab, demo, run, diagnose, rules, experiment, export, preflight), strict=True))
    return [modules[only]] if only else list(modules.values())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or (`only`) the one for that command alone."""
    from syncdoctor import __version__

    parser = Parser(
        prog="syncdoctor",
        description="Find why data-parallel training goes wrong only on many cards.",
        epilog="Start with `syncdoctor demo`; `syncdoctor COMMAND --help` tells more.",
    )
    parser.add_argument("--version", action="version", version=f"syncdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for module in _command_modules(only):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
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

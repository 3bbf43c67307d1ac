"""The `syncdoctor` command. Each part of the product registers its own subcommands
from its package's `cli` module, so this file only wires them together."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

EXIT_USAGE = 2


class InputError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    from syncdoctor import __version__
    from syncdoctor.doctor import cli as doctor_cli
    from syncdoctor.lab import cli as lab_cli
    from syncdoctor.preflight import cli as preflight_cli
    from syncdoctor.probe import cli as probe_cli

    parser = argparse.ArgumentParser(
        prog="syncdoctor",
        description="Find why data-parallel training goes wrong only on many cards.",
    )
    parser.add_argument("--version", action="version", version=f"syncdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    lab_cli.register(sub)
    probe_cli.register(sub)
    doctor_cli.register(sub)
    preflight_cli.register(sub)
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


if __name__ == "__main__":
    sys.exit(main())

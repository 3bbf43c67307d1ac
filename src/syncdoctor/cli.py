"""The `syncdoctor` command. Each part of the product registers its own subcommands
from its package's `cli` module, so this file only wires them together, and holds
what every subcommand shares: one-line input errors, argument checks, and help that
states each option's default."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from syncdoctor.errors import InputError

EXIT_USAGE = 2


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest known name, or ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def at_least(lowest: float, kind: Callable[[str], float] = int) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` no smaller than ``lowest``."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be at least {lowest:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


class _HelpFormatter(argparse.HelpFormatter):
    """Appends '(default: X)' to an option's help when it has a real default and the
    help does not state it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == "" or default == argparse.SUPPRESS
        if not unset and "default" not in text and action.option_strings and action.nargs != 0:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Every (sub)command's parser: the help formatter above, wider help columns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", lambda prog: _HelpFormatter(prog, max_help_position=32))
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from syncdoctor import __version__
    from syncdoctor import export as export_cli
    from syncdoctor.doctor import cli as doctor_cli
    from syncdoctor.experiment import cli as experiment_cli
    from syncdoctor.lab import cli as lab_cli
    from syncdoctor.preflight import cli as preflight_cli
    from syncdoctor.probe.run import launcher as probe_cli

    parser = Parser(
        prog="syncdoctor",
        description="Find why data-parallel training goes wrong only on many cards.",
        epilog="Start with `syncdoctor demo`; `syncdoctor COMMAND --help` tells more.",
    )
    parser.add_argument("--version", action="version", version=f"syncdoctor {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    lab_cli.register(sub)
    probe_cli.register(sub)
    doctor_cli.register(sub)
    experiment_cli.register(sub)
    export_cli.register(sub)
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

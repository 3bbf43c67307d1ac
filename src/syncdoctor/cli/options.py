"""What every command shares: the parser class (help that states each option's
default), argument types that refuse bad input in one line, and the options several
commands take (`--json`, `--world-size`, `--steps`, `--check-every`, `--on-mismatch`,
`--html`, a launcher command after `--`, a run folder that defaults to a timestamped
one, a report written where the user asked).

Library code never imports this package: its errors are `syncdoctor.errors.InputError`,
which `cli/app.py` prints as one line with exit code 2."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from syncdoctor.errors import InputError, did_you_mean
from syncdoctor.settings import ON_MISMATCH_CHOICES

__all__ = [
    "EXIT_USAGE",
    "Parser",
    "add_check_every",
    "add_command",
    "add_html",
    "add_json",
    "add_on_mismatch",
    "add_steps",
    "add_world_size",
    "at_least",
    "command_after_dashes",
    "did_you_mean",
    "out_or_timestamped",
    "write_output",
]

EXIT_USAGE = 2  # bad arguments or input: argparse's code, and InputError's


def at_least(lowest: float, kind: Callable[[str], float] = int) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` no smaller than ``lowest``; otherwise
    argparse's one-line error, e.g. "argument --steps: 'ten' is not an integer"."""

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


# The options several commands take. Each command keeps its own help text (what the
# option means there); the type, the check and the spelling are defined once here.


def add_json(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def add_world_size(p: argparse.ArgumentParser, help: str, *, default: int = 2, metavar: str | None = None) -> None:
    p.add_argument("--world-size", type=at_least(1), default=default, metavar=metavar, help=help)


def add_steps(p: argparse.ArgumentParser, help: str, *, default: int, metavar: str | None = None) -> None:
    p.add_argument("--steps", type=at_least(1), default=default, metavar=metavar, help=help)


def add_check_every(p: argparse.ArgumentParser, *, default: int) -> None:
    p.add_argument(
        "--check-every",
        type=at_least(1),
        default=default,
        metavar="K",
        help="the probe's cross-rank check every K steps",
    )


def add_on_mismatch(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--on-mismatch", choices=ON_MISMATCH_CHOICES, default=None, help=help)


def add_html(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--html", metavar="FILE", help=help)


def add_command(p: argparse.ArgumentParser, help: str) -> None:
    """The launcher command and its arguments: everything after the options (``--``
    first, so that the command's own options are not read as ours)."""
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help=help)


def command_after_dashes(args: argparse.Namespace, usage: str) -> list[str]:
    """The command given after ``--``; an InputError naming ``usage`` when there is none."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError(f"nothing to run: {usage}")
    return command


def out_or_timestamped(out: str | None, prefix: str) -> Path:
    """The run folder given with --out, else runs/PREFIX-YYYYmmdd-HHMMSS."""
    return Path(out or time.strftime(f"runs/{prefix}-%Y%m%d-%H%M%S"))


def write_output(path: Path, text: str) -> None:
    """Write a report the user asked for (its folder created); a path that cannot be
    written is an InputError in one line, not a traceback."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from exc

"""The errors every part may raise for bad input. The CLI prints them as one line
and exits 2; library code raises them without knowing about the CLI."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class InputError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest known name, or '': for an InputError's
    message about a name that is not one of ``known``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""

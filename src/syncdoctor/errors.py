"""The errors every part may raise for bad input. The CLI prints them as one line
and exits 2; library code raises them without knowing about the CLI."""

from __future__ import annotations


class InputError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""

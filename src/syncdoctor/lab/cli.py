"""Subcommands of the lab part."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # filled in by the lab work
    pass

"""Subcommands of the probe part."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # filled in by the probe work
    pass

"""The `syncdoctor` command: one module per command (`lab`, `demo`, `run`,
`diagnose`, `rules`, `experiment`, `export`, `preflight`), what they share in
`options.py`, the wiring in `app.py`. Each command module parses and prints; the
work is done by the library parts it calls, which never import this package.

`syncdoctor` (the console script), `python -m syncdoctor` and `python -m syncdoctor.cli`
all run `main`."""

from __future__ import annotations

from syncdoctor.cli.app import build_parser, main

__all__ = ["build_parser", "main"]

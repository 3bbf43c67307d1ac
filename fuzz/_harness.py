"""The libFuzzer entry point the four atheris harnesses share."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris
from corpus import seeds


def main(target: str, test_one_input: Callable[[bytes], None]) -> None:
    """libFuzzer's command line, as atheris takes it; without a corpus folder the
    seeds are written to a temporary one, so `python fuzz/fuzz_X.py -atheris_runs=N`
    starts from real inputs."""
    argv = list(sys.argv)
    with tempfile.TemporaryDirectory(prefix=f"fuzz-{target}-") as tmp:
        if not any(not a.startswith("-") for a in argv[1:]):
            for i, seed in enumerate(seeds(target)):
                (Path(tmp) / f"seed{i}").write_bytes(seed)
            argv.append(tmp)
        atheris.Setup(argv, test_one_input)
        atheris.Fuzz()

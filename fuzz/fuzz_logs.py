"""Fuzz the raw-log parsers: `python fuzz/fuzz_logs.py -atheris_runs=N` (libFuzzer flags)."""

import atheris

with atheris.instrument_imports(include=["syncdoctor"]):
    import targets
from _harness import main
from corpus import log_files, split


def test_one_input(data: bytes) -> None:
    targets.check_logs(log_files(split(data)))


if __name__ == "__main__":
    main("logs", test_one_input)

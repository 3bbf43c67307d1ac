"""Fuzz the probe record reader: `python fuzz/fuzz_records.py -atheris_runs=N`."""

import atheris

with atheris.instrument_imports(include=["syncdoctor"]):
    import targets
from _harness import main
from corpus import record_files, split


def test_one_input(data: bytes) -> None:
    targets.check_records(record_files(split(data)))


if __name__ == "__main__":
    main("records", test_one_input)

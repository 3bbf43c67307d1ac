#!/usr/bin/env bash
# The whole test suite, set-up included: `bash scripts/setup.sh --test` (idempotent:
# quick when everything is there; SYNCDOCTOR_NO_SETUP=1 skips it), then everything
# in .venv, then the MindSpore tests in .venv-ms (they skip, saying why, where
# MindSpore could not be installed). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SYNCDOCTOR_NO_SETUP:-0}" != 1 ]; then
    bash scripts/setup.sh --test
fi
# Lint and type-check first (mypy: ~1 min of CPU with no .mypy_cache, seconds with one),
# then the tiers, one folder each (tests/conftest.py marks by folder):
#   fast   tests/unit, tests/rules     no training: a broken rule fails in seconds
#   slow   tests/e2e/{lab,probe,experiment,zoo}   real multi-process training, per-test
#          times printed (the CI budget is watched from them)
#   tests/mindspore                    in .venv-ms
# Each tier runs in SYNCDOCTOR_TEST_JOBS pytest-xdist workers (default 2). The slow
# tier hands out whole files (--dist loadfile: a file's shared runs stay on one worker,
# and a lab run several files read is run once, by the first worker to need it): a
# launch leaves a core idle for a good part of its time (rendezvous, one rank importing
# while the other waits), so two at once fill both cores.
JOBS=${SYNCDOCTOR_TEST_JOBS:-2}
.venv/bin/ruff check src tests benchmarks fuzz scripts
.venv/bin/ruff format --check src tests benchmarks fuzz scripts
.venv/bin/mypy
# The import contracts (pyproject.toml [tool.importlinter]) and private names kept private.
.venv/bin/lint-imports --no-cache
.venv/bin/python scripts/check_private_names.py
.venv/bin/python -m pytest tests/unit tests/rules -n "$JOBS" "$@"
.venv/bin/python -m pytest tests/e2e -n "$JOBS" --dist loadfile -v -o console_output_style=times --durations=25 "$@"
if [ -x .venv-ms/bin/python ]; then
    # (no workers: its session starts all its jobs, four at a time, at its first test)
    .venv-ms/bin/python -m pytest tests/mindspore "$@"
else
    echo "MindSpore tests skipped: .venv-ms was not set up (no MindSpore wheel for this platform)"
fi

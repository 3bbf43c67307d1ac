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
# then the fast tier (unit, fixture and corpus tests: a broken rule fails in seconds),
# then the slow tier (real multi-process training), whose per-test times are printed:
# the CI budget is watched from them.
.venv/bin/ruff check src tests benchmarks fuzz scripts
.venv/bin/ruff format --check src tests benchmarks fuzz scripts
.venv/bin/mypy
# The import contracts (pyproject.toml [tool.importlinter]) and private names kept private.
.venv/bin/lint-imports --no-cache
.venv/bin/python scripts/check_private_names.py
.venv/bin/python -m pytest --ignore=tests/mindspore -m "not slow" "$@"
.venv/bin/python -m pytest --ignore=tests/mindspore -m slow -v -o console_output_style=times --durations=25 "$@"
if [ -x .venv-ms/bin/python ]; then
    .venv-ms/bin/python -m pytest tests/mindspore "$@"
else
    echo "MindSpore tests skipped: .venv-ms was not set up (no MindSpore wheel for this platform)"
fi

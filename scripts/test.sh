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
# The fast tier runs in SYNCDOCTOR_TEST_JOBS pytest-xdist workers (default 2). The slow
# tier runs in SYNCDOCTOR_E2E_JOBS workers (default 0: one process). Measured on a
# fresh clone of this 2-core machine: two workers took 2,719 s for it against about
# 2,000 s in one process (each launch already runs two or four ranks; two launches at
# once only share the cores and run into the tests' timeouts). On more cores, raise it
# (whole files go to one worker: --dist loadfile; the lab runs are shared by a lock).
# Bytecode is written as modules are first imported. A shell with PYTHONDONTWRITEBYTECODE=1
# (this workplace's sessions have it) keeps none, and uv installs compile none: every rank
# of every launch then compiles torch, its dynamo (DDP's constructor imports it) and sympy
# from source again. Measured on this 2-core machine, one two-rank lab run of 30 steps:
# 16.3 s of CPU with no bytecode against 7.3-8.7 s with it; `import torch` 3.6 s against 1.8 s.
unset PYTHONDONTWRITEBYTECODE
JOBS=${SYNCDOCTOR_TEST_JOBS:-2}
E2E_JOBS=${SYNCDOCTOR_E2E_JOBS:-0}
phase() { echo "== $1 at $(date +%T), ${SECONDS} s in"; }  # where the CI budget goes
phase "lint and types"
.venv/bin/ruff check src tests benchmarks fuzz scripts
.venv/bin/ruff format --check src tests benchmarks fuzz scripts
.venv/bin/mypy
# The import contracts (pyproject.toml [tool.importlinter]) and private names kept private.
.venv/bin/lint-imports --no-cache
.venv/bin/python scripts/check_private_names.py
phase "fast tier"
.venv/bin/python -m pytest tests/unit tests/rules -n "$JOBS" "$@"
phase "slow tier"
.venv/bin/python -m pytest tests/e2e -n "$E2E_JOBS" --dist loadfile -v -o console_output_style=times --durations=25 "$@"
phase "MindSpore tier"
if [ -x .venv-ms/bin/python ]; then
    # (no workers: its session starts all its jobs, four at a time, at its first test)
    .venv-ms/bin/python -m pytest tests/mindspore "$@"
else
    echo "MindSpore tests skipped: .venv-ms was not set up (no MindSpore wheel for this platform)"
fi
phase "done"

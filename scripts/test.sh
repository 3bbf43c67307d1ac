#!/usr/bin/env bash
# The whole test suite: everything in .venv, then the MindSpore tests in .venv-ms
# (they skip, saying why, where MindSpore could not be installed).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pytest --ignore=tests/mindspore "$@"
if [ -x .venv-ms/bin/python ]; then
    .venv-ms/bin/python -m pytest tests/mindspore "$@"
else
    echo "MindSpore tests skipped: .venv-ms was not set up (no MindSpore wheel for this platform)"
fi

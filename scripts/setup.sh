#!/usr/bin/env bash
# Set-up on a fresh machine with only Python: a virtual environment with syncdoctor,
# the CPU build of torch pinned for this machine (the package itself only asks for
# torch>=2.1, so GPU users keep their CUDA build), the test tools, and Chromium for
# the HTML report test. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0" -e ".[dev]"
bash scripts/install_chromium.sh >/dev/null
echo "syncdoctor set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

#!/usr/bin/env bash
# Set-up on a fresh machine with only Python. Idempotent.
#  .venv     syncdoctor, the CPU build of torch pinned for this machine (the package
#            itself only asks for torch>=2.1, so GPU users keep their CUDA build),
#            the test tools, and Chromium for the HTML report test.
#  .venv-ms  syncdoctor with the MindSpore extra (mindspore needs numpy<2, torch
#            does not, so the two live apart); skipped with a message where no
#            MindSpore wheel exists for this platform.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0" -e ".[dev,zoo]"
bash scripts/install_chromium.sh >/dev/null
echo "syncdoctor set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

if [ "${SYNCDOCTOR_SKIP_MINDSPORE:-0}" != 1 ]; then
    [ -x .venv-ms/bin/python ] || "$PYTHON" -m venv .venv-ms
    .venv-ms/bin/python -m pip install -q --upgrade pip
    if .venv-ms/bin/python -m pip install -q "mindspore==2.10.0" "numpy<2" -e ".[mindspore]" \
            scikit-learn pytest pytest-timeout hypothesis; then
        echo "MindSpore set up in .venv-ms ($(.venv-ms/bin/python -c 'import mindspore; print("mindspore", mindspore.__version__)' 2>/dev/null))"
    else
        echo "no MindSpore wheel for this platform: the MindSpore tests will be skipped"
    fi
fi

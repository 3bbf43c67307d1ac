#!/usr/bin/env bash
# Set-up on a fresh machine with only Python (Linux). Idempotent.
#
#   bash scripts/setup.sh          what `syncdoctor demo` needs, in .venv: syncdoctor,
#                                  the CPU build of torch pinned for this machine (the
#                                  package itself asks only for torch>=2.1, so GPU users
#                                  keep their CUDA build) and scikit-learn (the digits set)
#   bash scripts/setup.sh --test   also what the test suite needs: the test tools, the
#                                  client zoo (Lightning, transformers, accelerate), the
#                                  TensorBoard writer, Chromium for the HTML report tests,
#                                  and MindSpore in its own .venv-ms (it needs numpy<2)
#
# scripts/test.sh runs the --test set-up itself.
set -euo pipefail
cd "$(dirname "$0")/.."

TEST=0
case "${1:-}" in
    "") ;;
    --test) TEST=1 ;;
    *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3}
TORCH=${SYNCDOCTOR_TORCH:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# uv (from PyPI, by pip: the one package pip installs) installs the rest: it fetches
# and unpacks in parallel and compiles no bytecode, about four times faster than pip
# on a fresh machine with no cache. It does not read pip's configuration, so the
# wheel folders pip is told to look in (where a machine keeps its CPU build of
# torch) are passed on; SYNCDOCTOR_PIP=1 installs with pip as before.
[ "${SYNCDOCTOR_PIP:-0}" = 1 ] || [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv
install() {  # install PYTHON PACKAGES...: into that interpreter's environment
    local python=$1
    shift
    if [ "${SYNCDOCTOR_PIP:-0}" = 1 ]; then
        "$python" -m pip install -q --no-compile "$@"
        return
    fi
    local links=()
    for link in ${PIP_FIND_LINKS:-} $(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true); do
        links+=(--find-links "$link")
    done
    .venv/bin/uv pip install -q --python "$python" "${links[@]}" "$@"
}
if [ "$TEST" = 1 ]; then
    install .venv/bin/python "$TORCH" -e ".[dev,zoo,tensorboard]"
else
    install .venv/bin/python "$TORCH" -e ".[lab]"
    # Byte-compiling every file of torch, sympy and scipy up front costs more CPU than
    # the demo itself. One import of what a lab rank imports compiles just that, once,
    # instead of in every rank process at its first start.
    # (env -u: a shell with PYTHONDONTWRITEBYTECODE=1 would keep nothing of it.)
    # It names the torch it imported too (one import of torch costs seconds).
    VERSION=$(env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -c "import torch.distributed, torch.nn.parallel, syncdoctor.probe, syncdoctor.lab.runner, syncdoctor.doctor.diagnose, syncdoctor.doctor.report, torch; print('torch', torch.__version__)")
fi
echo "syncdoctor set up in .venv (${VERSION:-$(.venv/bin/python -c 'import torch; print("torch", torch.__version__)')})"
if [ "$TEST" = 0 ]; then
    echo "next: .venv/bin/syncdoctor demo   (the test set-up: bash scripts/setup.sh --test, or just bash scripts/test.sh)"
    exit 0
fi

bash scripts/install_chromium.sh >/dev/null
echo "Chromium: $(/usr/bin/chromium --version 2>/dev/null || echo missing)"

if [ "${SYNCDOCTOR_SKIP_MINDSPORE:-0}" != 1 ]; then
    [ -x .venv-ms/bin/python ] || "$PYTHON" -m venv .venv-ms
    if install .venv-ms/bin/python "mindspore==2.10.0" "numpy<2" -e ".[mindspore]" \
            scikit-learn pytest pytest-timeout hypothesis; then
        echo "MindSpore set up in .venv-ms ($(.venv-ms/bin/python -c 'import mindspore; print("mindspore", mindspore.__version__)' 2>/dev/null))"
    else
        echo "no MindSpore wheel for this platform: the MindSpore tests will be skipped"
    fi
fi

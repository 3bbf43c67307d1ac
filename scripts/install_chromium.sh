#!/usr/bin/env bash
# Installs Debian's headless-capable Chromium for the HTML report test
# (tests/unit/doctor/test_report_html.py). Idempotent: does nothing when present.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq chromium
/usr/bin/chromium --version 2>/dev/null

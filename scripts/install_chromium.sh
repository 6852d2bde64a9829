#!/usr/bin/env bash
# The test suite opens a run's HTML report in Debian's headless chromium (tests/harness/test_report_render.py).
# Installs it where /usr/bin/chromium is missing: apt, as root or through sudo. The README's test command and
# .ci/run run this first.
set -euo pipefail
if [ -e /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "install_chromium.sh: the tests need Debian's chromium at /usr/bin/chromium" \
         "(tests/harness/test_report_render.py) and this machine has no apt-get: install it there yourself" >&2
    exit 1
fi
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        echo "install_chromium.sh: installing chromium (apt-get install chromium) needs root or sudo; run it as root" \
             "or install the package yourself" >&2
        exit 1
    fi
    as_root=(sudo)
fi
"${as_root[@]}" apt-get update -qq
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

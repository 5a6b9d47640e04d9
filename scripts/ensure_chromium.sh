#!/usr/bin/env bash
# The tree viewer's test renders pages in a real headless Chromium (tests/eval/test_viewer.py).
# Install Debian's `chromium` when it is missing; sudo only when not root. Idempotent and quiet.
set -euo pipefail
command -v chromium >/dev/null 2>&1 && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing chromium (apt) for the tree viewer's browser test" >&2
$SUDO apt-get update -qq
$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
command -v chromium >/dev/null

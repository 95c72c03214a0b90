#!/bin/sh
# Installs the headless Chromium that tests/e2e/test_html_chromium.py drives (Debian package `chromium`).
# Harmless everywhere: does nothing when a Chromium is already there, and only warns when apt is missing
# or cannot run (not root, no network) -- the test then skips.
set -u
for name in chromium chromium-browser google-chrome; do
    if command -v "$name" >/dev/null 2>&1; then
        echo "install-chromium: $(command -v "$name") already installed"
        exit 0
    fi
done
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium: no apt-get here; install Chromium yourself to run the HTML browser test" >&2
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo -n"
    else
        echo "install-chromium: not root and no password-less sudo; skipping" >&2
        exit 0
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if $SUDO apt-get install -y --no-install-recommends chromium \
   || { $SUDO apt-get update && $SUDO apt-get install -y --no-install-recommends chromium; }; then
    echo "install-chromium: installed $(command -v chromium)"
else
    echo "install-chromium: apt-get could not install chromium; the HTML browser test will skip" >&2
fi
exit 0

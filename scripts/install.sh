#!/usr/bin/env bash
# Creates .venv (once) and installs ddpdoctor into it: torch==2.13.0 first (the CPU build; a bare `torch`
# requirement would pull a multi-GB CUDA build), then the package with its test extras. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.ddpdoctor-installed
want="$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  quiet() { "$@" 2>&1 | { grep -v "^WARNING: Location 'file://" || true; }; return "${PIPESTATUS[0]}"; }
  quiet .venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
  quiet .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,hta,bench,frameworks]"
  echo "$want" > "$stamp"
fi
bash scripts/install-chromium.sh || echo "chromium not installed: the HTML browser test will skip"

#!/usr/bin/env bash
# The README's second command (and CI's): install if needed, lint, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ruff check ddpdoctor tests benchmarks
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -n 2 --dist loadgroup -q "$@"

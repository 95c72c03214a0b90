#!/usr/bin/env bash
# The README's first command: set up a fresh machine and run the main job on the bundled example
# (2 CPU ranks over gloo), ending with ddpdoctor's report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/ddpdoctor profile --nproc-per-node 2 --name demo examples/train_mlp.py --epochs 1

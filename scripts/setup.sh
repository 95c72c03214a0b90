#!/usr/bin/env bash
# The README's first command: set up a fresh machine and run the main job on the bundled example
# (2 CPU ranks over gloo), ending with ddpdoctor's report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
.venv/bin/ddpdoctor profile --nproc-per-node 2 --name demo --overwrite examples/train_mlp.py --epochs 1
echo "set-up done; the run directory is ddpdoctor-runs/demo (report.html, traces/, manifest.json)"

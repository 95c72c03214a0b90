#!/usr/bin/env bash
# Re-records sample_traces/mlp_gloo_2rank: a small run directory made by ddpdoctor itself (2 CPU gloo ranks,
# 1 MB buckets so each step has several), used by the docs, the demo and the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
out=sample_traces/mlp_gloo_2rank
.venv/bin/python -m ddpdoctor profile --nproc-per-node 2 -q --overwrite --out "$out" \
  examples/train_mlp.py --epochs 1 --bucket-cap-mb 1 --width 512 --layers 4
rm -rf "$out/torchrun"   # torchrun's copy of the ranks' logs (kept in ranks/rankR/)
du -sh "$out"

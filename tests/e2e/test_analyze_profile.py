"""A real 2-rank gloo launch under `ddpdoctor profile`: each rank writes its summary, and `analyze` of the run
directory (merging summaries) agrees with re-reading the traces."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES, run_cli

pytestmark = pytest.mark.slow


def test_profile_writes_summaries_that_analyze_merges(tmp_path):
    run = tmp_path / "run"
    proc = run_cli("profile", "-q", "--json", "--nproc-per-node", "2", "--active", "3", "--out", str(run),
                   str(EXAMPLES / "train_mlp.py"), "--epochs", "1", "--layers", "8", "--bucket-cap-mb", "1")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    for rank in (0, 1):
        summary = json.loads((run / "ranks" / f"rank{rank}" / "summary.json").read_text())
        assert summary["metrics"]["rank"] == rank and summary["metrics"]["steps"] == 3
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    merged = json.loads(run_cli("analyze", str(run), "--json").stdout)
    reread = json.loads(run_cli("analyze", str(run), "--json", "--reread").stdout)
    for a, b in zip(merged["ranks"], reread["ranks"], strict=True):
        assert a["overlap_pct"] == pytest.approx(b["overlap_pct"])
        assert a["comm_us"] == pytest.approx(b["comm_us"]) and a["comm_us"] > 0
    # Several buckets per step (bucket_cap_mb=1), the same on both ranks.
    per_rank = {r: len([b for b in merged["collectives"]["buckets"] if b["rank"] == r]) for r in (0, 1)}
    assert per_rank[0] == per_rank[1] >= 6
    assert merged["ddp"][0]["bucket_cap_mb"] == 1.0

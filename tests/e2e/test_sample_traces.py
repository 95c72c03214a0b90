"""sample_traces/: the run directory ddpdoctor recorded itself is analysable as the docs say."""

from __future__ import annotations

import json

from tests.conftest import SAMPLE_RUN, run_cli


def test_sample_run_analyses_from_summaries_and_traces_alike():
    merged = run_cli("analyze", str(SAMPLE_RUN), "--json")
    reread = run_cli("analyze", str(SAMPLE_RUN), "--json", "--reread")
    assert merged.returncode in (0, 1) and reread.returncode in (0, 1), merged.stderr + reread.stderr
    a, b = json.loads(merged.stdout), json.loads(reread.stdout)
    assert [r["rank"] for r in a["ranks"]] == [0, 1]
    for ra, rb in zip(a["ranks"], b["ranks"], strict=True):
        assert ra["steps"] == 3 and ra["step_ids"] == [3, 4, 5]
        assert ra["comm_us"] > 0 and 0 <= ra["overlap_pct"] <= 100
        assert abs(ra["overlap_pct"] - rb["overlap_pct"]) < 1e-6  # the rank's own summary = re-reading its trace
    buckets = [b for b in a["collectives"]["buckets"] if b["rank"] == 0 and b["step"] == 4]
    assert len(buckets) >= 3  # 1 MB bucket cap over ~3 MB of gradients
    assert a["ddp"][0]["bucket_cap_mb"] == 1.0 and a["ddp"][0]["buckets_rebuilt"]


def test_sample_run_terminal_report_names_ranks_and_advice():
    proc = run_cli("analyze", str(SAMPLE_RUN))
    assert proc.returncode in (0, 1), proc.stderr
    assert "rank" in proc.stdout and "Findings" in proc.stdout

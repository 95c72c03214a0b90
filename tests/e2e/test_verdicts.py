"""Verdicts a user can trust, on real 2-rank gloo jobs: a healthy script is never "error"; profile stops after its
window on a long script; a script shorter than the window says so with flags that fit; a crash leads the report."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.teardown import settle_run

pytestmark = pytest.mark.slow


def _profile(tmp_path, script: str, *flags: str):
    out = tmp_path / "run"
    res = run_cli("profile", "--nproc-per-node", "2", "--out", str(out), "-q", "--json", *flags,
                  str(SCENARIOS / script))
    settle_run(res, out, flags)  # torch's teardown abort alone is forgiven (tests/teardown.py)
    return out, res


def test_healthy_script_is_not_an_error_and_perf_findings_carry_their_cost(tmp_path):
    out, res = _profile(tmp_path, "healthy.py")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["status"] != "error"
    for f in report["findings"]:
        assert f["severity"] != "error", f
        if f["id"] in ("exposed-comm-high", "comm-tail-after-backward", "straggler-rank", "data-loading-wait"):
            assert "cost_ms_per_step" in f["evidence"] and "cost_pct_of_step" in f["evidence"], f
        for v in f["evidence"].values():  # no share over 100% anywhere a share is meant
            if isinstance(v, dict) and "interval" in v:
                assert v["interval"][0] <= v["value"] <= v["interval"][1]
    assert any("verdicts rest on" in n for n in report.get("notes", []))


def test_profile_returns_soon_after_its_window_on_a_long_script(tmp_path):
    started = time.monotonic()
    out, res = _profile(tmp_path, "long_training.py")
    took = time.monotonic() - started
    assert res.returncode == 0, res.stderr[-3000:]
    # The script would train for ~30 minutes; the window is 6 steps of ~20 ms plus startup.
    assert took < 150, took
    report = json.loads(res.stdout)
    assert any("stopped after the profiled window" in n for n in report.get("notes", [])), report.get("notes")
    status = json.loads((out / "ranks" / "rank1" / "status.json").read_text())
    assert status["exit_code"] == 0 and status["stopped_after_window"] >= 6 and status["traces"]


def test_script_shorter_than_the_window_says_which_flags_fit(tmp_path):
    out, res = _profile(tmp_path, "one_step.py")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["status"] == "warning"
    f = next(f for f in report["findings"] if f["id"] == "profile-window-not-reached")
    assert f["evidence"]["iterations_seen"] == 1 and f["evidence"]["needed"] >= 6
    assert "--wait 0 --warmup 0 --active 1" in f["advice"]
    # The flags it suggests do profile that script.
    out2 = tmp_path / "again"
    res2 = run_cli("profile", "--nproc-per-node", "2", "--out", str(out2), "-q", "--json", "--wait", "0", "--warmup",
                   "0", "--active", "1", str(SCENARIOS / "one_step.py"))
    assert res2.returncode == 0 and list((out2 / "traces").glob("rank*.pt.trace.json.gz")), res2.stderr[-2000:]
    assert "profile-window-not-reached" not in {f["id"] for f in json.loads(res2.stdout)["findings"]}


def test_a_crash_leads_the_report(tmp_path):
    out, res = _profile(tmp_path, "crash_rank1.py")
    assert res.returncode == 1, res.stderr[-3000:]
    report = json.loads(res.stdout)
    assert report["status"] == "error"
    assert report["findings"][0]["id"] == "rank-crashed", [f["id"] for f in report["findings"]]
    for f in report["findings"][1:]:
        if f["id"] not in ("rank-crashed", "rank-no-status", "hang"):
            assert f["severity"] == "info" and f["evidence"].get("incomplete_run") == "crashed", f


def test_gradient_accumulation_reads_the_synced_backward_pass(tmp_path):
    out, res = _profile(tmp_path, "grad_accum.py")
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    for r in report["ranks"]:
        # 4 micro-steps per iteration: 4 backward passes, 3 under no_sync and the synced one.
        assert [s["backward_passes"] for s in r["per_step"]] == [4] * len(r["per_step"]), r["per_step"]
    # The data fetch's .item() between micro-steps is not "inside backward": only the synced pass is read.
    assert "sync-in-backward" not in {f["id"] for f in report["findings"]}
    assert report["status"] != "error"

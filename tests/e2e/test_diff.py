"""`diff` and `profile --baseline` on real 2-rank gloo runs: two profiles of one unchanged job are quiet; one rank made
slower in data loading (30 ms per batch) is named with its rank, its part of the step and a step change near 30 ms,
and the bucket_cap_mb changed in the same run shows as a new bucket layout; --fail-on warning is a CI gate."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SCENARIOS, run_cli

# One worker runs the whole module (--dist loadgroup), so its module-scoped run is made once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="diff")]

SLEEP_MS = 30.0
JOB = str(SCENARIOS / "diff_job.py")


def _profile(out, *args: str, baseline=None):
    extra = ["--baseline", str(baseline)] if baseline else []
    res = run_cli("profile", "--nproc-per-node", "2", "--active", "15", "-q", "--json", "--out", str(out), *extra,
                  JOB, "--steps", "40", *args)
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff")
    base = root / "base"
    _profile(base)
    same = _profile(root / "same", baseline=base)
    slow = _profile(root / "slow", "--slow-rank", "1", "--data-sleep-ms", str(SLEEP_MS), "--bucket-cap-mb", "0.1",
                    baseline=base)
    return root, same, slow


def test_two_profiles_of_the_same_job_are_quiet(runs):
    root, same, _ = runs
    d = same["diff"]
    assert d["changes"] == [] or {c["key"] for c in d["changes"]} <= {"host.load_1min"}
    assert not [f for f in same["findings"] if f["id"].startswith("diff-") and f["severity"] != "info"]
    res = run_cli("diff", str(root / "base"), str(root / "same"), "--fail-on", "warning")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "step time" in res.stdout


def test_slow_data_on_one_rank_is_named_with_rank_part_and_size(runs):
    root, _, slow = runs
    [f] = [f for f in slow["findings"] if f["id"] == "diff-step-slower"]
    assert f["severity"] == "warning" and 1 in f["ranks"]
    # the step grew by about the injected sleep (every rank waits for rank 1 at the gradient all-reduce)
    assert 0.6 * SLEEP_MS <= f["evidence"]["cost_ms_per_step"] <= 1.6 * SLEEP_MS
    lead = f["evidence"]["contributors"][0]
    assert (lead["component"], lead["ranks"]) == ("data_wait", [1])
    assert 0.8 * SLEEP_MS <= lead["delta_ms"]["value"] <= 1.3 * SLEEP_MS
    assert "data wait on rank 1" in f["title"]
    keys = {c["key"] for c in slow["diff"]["changes"]}
    assert {"script.args", "ddp.bucket_cap_mb"} <= keys
    # the CI gate, and the terminal's one screen
    res = run_cli("diff", str(root / "base"), str(root / "slow"), "--fail-on", "warning")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "data wait (resource) on rank(s) 1" in res.stdout and "what else changed" in res.stdout


def test_bucket_cap_change_shows_the_layout_change(runs):
    _, _, slow = runs
    b = slow["diff"]["buckets"]
    assert b["bucket_cap_mb"] == {"base": 25.0, "new": 0.1} and b["layout_changed"]
    assert len(b["layout_bytes"]["new"]) > len(b["layout_bytes"]["base"]) == 1
    assert sum(b["layout_bytes"]["new"]) == sum(b["layout_bytes"]["base"])  # the same gradients, cut smaller
    assert any(f["id"] == "diff-bucket-layout" for f in slow["findings"])


def test_baseline_diff_is_in_every_view_of_the_run(runs):
    root, _, _ = runs
    saved = json.loads((root / "slow" / "report.json").read_text())
    assert saved["diff"]["step"]["significant"]
    html = (root / "slow" / "report.html").read_text()
    assert 'id="diff"' in html and "Step composition by phase" in html and "<svg" in html
    from ddpdoctor.renderers.diff_html import render_report_html
    from ddpdoctor.tensorboard_plugin.runs import load_report

    assert 'id="diff"' in render_report_html(load_report(root / "slow"))  # the TensorBoard tab's page


def test_a_run_that_failed_is_bad_input(runs, tmp_path):
    root, _, _ = runs
    failed = tmp_path / "failed"
    res = run_cli("profile", "--nproc-per-node", "2", "--active", "3", "-q", "--out", str(failed),
                  str(SCENARIOS / "crash_rank1.py"))
    assert res.returncode != 0
    res = run_cli("diff", str(root / "base"), str(failed))
    assert res.returncode == 2 and "the new run failed" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1

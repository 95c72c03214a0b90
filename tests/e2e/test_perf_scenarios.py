"""Performance findings on a real 2-rank gloo run: a .item() in gradient hooks is found inside backward, an unneeded
find_unused_parameters=True is caught, a 20 ms-per-batch DataLoader is seen as data wait, and the exit code follows the worst finding (also with --fail-on warning)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SCENARIOS, run_cli

# One worker runs the whole module (--dist loadgroup), so its module-scoped run is made once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="perf_scenarios")]


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
    try:
        from ddpdoctor.analyses.pipeline import analyze_paths  # noqa: F401
    except ImportError:
        pytest.skip("needs the analyze pipeline (ddpdoctor.analyses.pipeline.analyze_paths)")
    run_dir = tmp_path_factory.mktemp("sync")
    res = run_cli("profile", "--nproc-per-node", "2", "--active", "3", "--out", str(run_dir), "-q", "--json",
                  "--fail-on", "error",
                  str(SCENARIOS / "sync_in_backward.py"))
    assert res.returncode in (0, 1), res.stderr[-3000:]
    return run_dir, res


def _findings(stdout: str) -> dict:
    return {f["id"]: f for f in json.loads(stdout)["findings"]}


def test_item_in_backward_hooks_is_found(sync_run):
    run_dir, res = sync_run
    f = _findings(res.stdout)["sync-in-backward"]
    # 6 parameters, one .item() per gradient, 3 recorded steps, 2 ranks (aten::_local_scalar_dense not counted twice).
    assert f["evidence"]["calls"] == {"aten::item": 36}
    assert f["ranks"] == [0, 1] and f["evidence"]["steps"] == [3, 4, 5]
    assert f["severity"] == "info"  # CPU ranks: no device queue to wait for


def test_find_unused_parameters_when_all_are_used(sync_run):
    run_dir, res = sync_run
    f = _findings(res.stdout)["find-unused-parameters-unneeded"]
    assert f["severity"] == "warning"
    assert f["evidence"]["parameter_tensors"] == 6 and f["evidence"]["gradients_per_step"] == [6]


def test_slow_data_loading(sync_run):
    run_dir, res = sync_run
    f = _findings(res.stdout)["data-loading-wait"]
    assert f["ranks"] == [0, 1]
    # Each batch sleeps 20 ms in the main process: at least that much wait per step, on every rank.
    assert all(v >= 20.0 for v in f["evidence"]["data_wait_ms_per_step"].values()), f["evidence"]


def test_exit_code_follows_the_worst_finding(sync_run):
    run_dir, res = sync_run  # profiled with --fail-on error
    sev = {f["severity"] for f in _findings(res.stdout).values()}
    assert res.returncode == (1 if "error" in sev else 0)
    strict = run_cli("analyze", str(run_dir), "--json", "--fail-on", "warning")
    sev = {f["severity"] for f in _findings(strict.stdout).values()}
    assert strict.returncode == (1 if sev & {"warning", "error"} else 0), strict.stderr[-2000:]

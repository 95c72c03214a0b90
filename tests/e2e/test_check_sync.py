"""ddpdoctor check-sync on real 2-rank gloo jobs: correct scripts stay silent, each planted bug is named."""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES, SCENARIOS, run_cli
from tests.teardown import settle, settle_cli

pytestmark = pytest.mark.slow

SCRIPT = str(SCENARIOS / "sync_train.py")


def _check(tmp_path, *args: str, bug: str | None = None, extra: tuple[str, ...] = ()):
    out = tmp_path / "run"
    script_args = ["--bug", bug] if bug else []
    proc = run_cli("check-sync", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), *extra,
                   *(args or (SCRIPT,)), *script_args)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = settle_cli(proc, json.loads(proc.stdout), extra)  # torch's teardown abort alone is forgiven
    return proc, report, out


def _ids(report, *severities: str) -> list[str]:
    return sorted(f["id"] for f in report["findings"] if f["severity"] in severities)


def _finding(report, id_: str) -> dict:
    found = [f for f in report["findings"] if f["id"] == id_]
    assert found, report["findings"]
    return found[0]


def test_bundled_mlp_is_clean_and_ddp_equivalent(tmp_path):
    # --data-steps 0: stop right after the 5 checked steps instead of running on to a second epoch.
    proc, report, out = _check(tmp_path, str(EXAMPLES / "train_mlp.py"), "--epochs", "1",
                               extra=("--equivalence", "--data-steps", "0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report["status"] == "ok" and _ids(report, "warning", "error") == []
    assert any("an epoch is 12 steps here: run with --data-steps 8" in n for n in report["notes"]), report["notes"]
    checks = report["checks"]
    assert checks["steps_checked"] == 5 and checks["ranks"] == [0, 1]
    # 12 parameter tensors (6 Linear layers) x 5 steps x 1 peer rank, for gradients and parameters alike.
    assert checks["grads"]["comparisons"] == 60 and checks["params"]["comparisons"] == 60
    eq = _finding(report, "ddp-equivalence")
    assert eq["severity"] == "info" and eq["evidence"]["max_relative_error"] < 1e-3
    assert len(eq["evidence"]["relative_error"]) == 12 and eq["evidence"]["batch_sizes"] == [32, 32]
    for rank in (0, 1):  # stopped cleanly after 5 steps, exit code 0
        status = json.loads((out / "ranks" / f"rank{rank}" / "status.json").read_text())
        assert status["exit_code"] == 0 and status["steps_completed"] == 5
        assert status["stopped_by"] == "check-sync after 5 steps"


def test_batchnorm_with_broadcast_buffers_is_clean_through_the_python_api(tmp_path):
    import ddpdoctor

    report = ddpdoctor.check_sync(SCRIPT, "--bug", "bn", out=tmp_path / "run", equivalence=True)
    _, doc = settle(None, report)  # torch's teardown abort alone is forgiven (tests/teardown.py)
    assert doc["status"] == "ok", doc["findings"]
    assert doc["job"]["exit_code"] == 0
    assert report.sections["checks"]["buffers"]["comparisons"] == 3 * 5  # running_mean, running_var, count
    assert report.exit_code() == 0
    # With BatchNorm the union batch differs by design; each rank's batch run on its own must match DDP.
    (eq,) = [f for f in report.findings if f.id == "ddp-equivalence"]
    assert eq.evidence["caveats"] == ["batchnorm"] and eq.evidence["max_relative_error_per_rank_batches"] < 1e-3


def test_batchnorm_without_broadcast_buffers_warns(tmp_path):
    proc, report, _ = _check(tmp_path, bug="bn-no-broadcast", extra=("--fail-on", "warning"))
    assert proc.returncode == 1  # a warning, and --fail-on warning
    assert _ids(report, "warning", "error") == ["buffer-divergence"]
    f = _finding(report, "buffer-divergence")
    assert f["severity"] == "warning" and f["evidence"]["batchnorm"] is True
    assert f["evidence"]["step"] == 1  # step 0's forward saw the buffers DDP broadcast at construction
    assert set(f["evidence"]["buffers"]) == {"bn.running_mean", "bn.running_var"}
    assert "broadcast_buffers" in f["advice"] and "SyncBatchNorm" in f["advice"]


def test_missing_set_epoch(tmp_path):
    proc, report, _ = _check(tmp_path, bug="no-set-epoch")
    assert proc.returncode == 0
    assert _ids(report, "warning", "error") == ["sampler-no-set-epoch"]
    f = _finding(report, "sampler-no-set-epoch")
    assert f["evidence"]["epochs_same_as_first"] == [1, 2] and f["evidence"]["set_epoch_calls"] == 0


def test_no_distributed_sampler(tmp_path):
    proc, report, _ = _check(tmp_path, bug="no-sampler")
    assert proc.returncode == 1
    assert _ids(report, "warning", "error") == ["sampler-overlap"]
    f = _finding(report, "sampler-overlap")
    assert f["severity"] == "error" and f["evidence"]["shared_samples"] == 16 and f["ranks"] == [0, 1]


def test_iterable_dataset_not_split_by_rank(tmp_path):
    proc, report, _ = _check(tmp_path, bug="stream")
    assert proc.returncode == 1
    assert _ids(report, "warning", "error") == ["sampler-overlap"]
    f = _finding(report, "sampler-overlap")
    # Compared by sample hash: 4 batches of 4 consumed per epoch, all shared.
    assert f["evidence"]["by"] == "hashes" and f["evidence"]["shared_samples"] == 16


def test_hand_made_shards_overlap_and_leave_samples_unused(tmp_path):
    proc, report, _ = _check(tmp_path, bug="shards")
    assert proc.returncode == 1
    assert _ids(report, "warning", "error") == ["sampler-coverage", "sampler-overlap"]
    assert _finding(report, "sampler-overlap")["evidence"]["examples"] == [4, 5]
    cov = _finding(report, "sampler-coverage")
    assert cov["evidence"]["missing"] == 6 and cov["evidence"]["examples"] == [10, 11, 12, 13, 14, 15]


def test_parameter_edited_on_one_rank_after_wrapping(tmp_path):
    proc, report, _ = _check(tmp_path, bug="param-edit")
    assert proc.returncode == 1
    assert _ids(report, "warning", "error") == ["param-divergence"]  # gradients are still averaged
    f = _finding(report, "param-divergence")
    assert f["evidence"]["step"] == 0 and f["evidence"]["parameters"] == ["fc1.weight"] and f["ranks"] == [1]
    assert f["evidence"]["max_abs_diff"] > 0


def test_every_backward_under_no_sync(tmp_path):
    proc, report, _ = _check(tmp_path, bug="no-sync")
    assert proc.returncode == 1
    assert _ids(report, "error") == ["grad-divergence", "grads-never-synced", "param-divergence"]
    assert _finding(report, "grads-never-synced")["evidence"]["steps"] == [0, 1, 2, 3, 4]
    assert _finding(report, "grad-divergence")["evidence"]["step"] == 0


def test_uneven_batches(tmp_path):
    proc, report, _ = _check(tmp_path, bug="uneven")
    assert proc.returncode == 1
    # the per-step fingerprint (issue 38) also sees rank 0's loader run dry first: the same fault, from the job
    assert _ids(report, "warning", "error") == ["divergence", "sampler-uneven-batches"]
    assert _finding(report, "divergence")["evidence"]["items"][0]["field"] == "dry"
    assert _finding(report, "sampler-uneven-batches")["evidence"]["batches"] == {"0": 3, "1": 5}


def test_unused_parameters(tmp_path):
    proc, report, _ = _check(tmp_path, bug="unused")
    assert proc.returncode == 0
    assert _ids(report, "warning", "error") == ["unused-parameters"]
    assert _finding(report, "unused-parameters")["evidence"]["parameters"] == ["spare.weight", "spare.bias"]


def test_bad_input(tmp_path):
    proc = run_cli("check-sync", "--nproc-per-node", "2", "--out", str(tmp_path / "r"), "no_such_script.py")
    assert proc.returncode == 2 and "no_such_script.py: script not found" in proc.stderr
    proc = run_cli("check-sync", "--steps", "-1", "--out", str(tmp_path / "r"), SCRIPT)
    assert proc.returncode == 2 and "--steps must be >= 0" in proc.stderr
    assert "Traceback" not in proc.stderr

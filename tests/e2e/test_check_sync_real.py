"""check-sync on scripts shaped like real public ones (2 gloo ranks): the job runs exactly as under plain torchrun,
a tutorial's batch-size peek is not an epoch, a missing set_epoch is found at default settings, shard bugs are
named by cause, and a job without DDP has its parameters compared."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, SCENARIOS, run_cli
from tests.teardown import settle_cli

pytestmark = pytest.mark.slow

OUTPUTS = str(SCENARIOS / "model_outputs.py")
TUTORIAL = str(SCENARIOS / "tutorial_peek.py")
SYNC = str(SCENARIOS / "sync_train.py")


def _hashes(text: str) -> dict[str, str]:
    return dict(re.findall(r"rank (\d) params ([0-9a-f]{16})", text))


def _rank_hashes(run) -> dict[str, str]:
    """What the ranks printed (check-sync -q keeps their output in the run directory)."""
    return _hashes("".join((run / "ranks" / f"rank{r}" / "stdout.log").read_text() for r in (0, 1)))


def _check_sync(tmp_path, name: str, *args: str):
    proc = run_cli("check-sync", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / name), *args)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc, settle_cli(proc, json.loads(proc.stdout), args)  # torch's teardown abort alone is forgiven


def _serious(report) -> list[str]:
    return sorted(f["id"] for f in report["findings"] if f["severity"] in ("warning", "error"))


def _plain_torchrun(script) -> subprocess.CompletedProcess[str]:
    """The reference run, without ddpdoctor. torch 2.13's gloo itself sometimes aborts a rank at teardown
    ("terminate called without an active exception", SIGABRT; once in 5 suite runs on a fresh clone, no ddpdoctor
    involved; cf. pytorch/pytorch#179291 on gloo worker threads at exit): the reference is then taken again, at most
    three times. What is tested is ddpdoctor's runs below, which are never retried."""
    for _ in range(3):
        plain = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                "2", script], cwd=REPO, capture_output=True, text=True, timeout=240)
        if plain.returncode == 0 or "(SIGABRT)" not in plain.stderr:
            return plain
    return plain


def test_any_model_output_leaves_the_job_as_plain_torchrun_runs_it(tmp_path):
    plain = _plain_torchrun(OUTPUTS)
    assert plain.returncode == 0, plain.stderr[-3000:]
    expected = _hashes(plain.stdout)
    assert set(expected) == {"0", "1"}
    # The first model returns its loss (a 0-d tensor), like minGPT: this crashed the job before.
    proc, report = _check_sync(tmp_path, "zerod", "--steps", "0", "--equivalence", OUTPUTS)
    assert proc.returncode == 0 and _rank_hashes(tmp_path / "zerod") == expected, proc.stderr[-3000:]
    assert _serious(report) == [] and "notes" not in report
    (eq,) = [f for f in report["findings"] if f["id"] == "ddp-equivalence"]
    assert eq["severity"] == "info" and eq["evidence"]["mode"] == "per-rank batches"
    assert eq["evidence"]["max_relative_error"] < 1e-3
    # A model that cannot be deep-copied (it holds a lock): the equivalence probe notes it and steps aside.
    proc, report = _check_sync(tmp_path, "lock", "--steps", "0", "--equivalence", OUTPUTS, "--lock")
    assert proc.returncode == 0 and _rank_hashes(tmp_path / "lock") == expected, proc.stderr[-3000:]
    assert _serious(report) == [] and report["checks"]["params"]["comparisons"] > 0
    assert any("equivalence probe failed" in n and "cannot pickle" in n for n in report["notes"]), report["notes"]
    status = json.loads((tmp_path / "lock" / "ranks" / "rank0" / "status.json").read_text())
    assert status["exit_code"] == 0 and "stopped_by" not in status


def test_tutorial_peek_before_set_epoch_is_not_an_epoch(tmp_path):
    proc, report = _check_sync(tmp_path, "ok", TUTORIAL, "3")
    assert proc.returncode == 0 and _serious(report) == [], report
    # An epoch is 8 steps: the data recorder ran on past --steps 5 to the second epoch's first step (the ranks
    # agreed at step 5 that 4 more steps were needed).
    assert report["checks"]["steps_checked"] == 5 and report["checks"]["steps_run"] == 9


def test_missing_set_epoch_found_at_default_settings(tmp_path):
    proc, report = _check_sync(tmp_path, "bug", TUTORIAL, "3", "--no-set-epoch")
    assert proc.returncode == 0 and _serious(report) == ["sampler-no-set-epoch"], report
    (f,) = report["findings"]
    assert f["evidence"]["epochs_same_as_first"] == [1] and f["evidence"]["set_epoch_calls"] == 0


def test_unseeded_random_split_named(tmp_path):
    proc, report = _check_sync(tmp_path, "split", SYNC, "--bug", "random-split")
    assert proc.returncode == 1
    assert _serious(report) == ["sampler-coverage", "sampler-overlap"]
    for f in report["findings"]:
        assert f["evidence"]["cause"] == "dataset-differs" and "unseeded random_split" in f["title"]


def test_uneven_last_batch_named(tmp_path):
    proc, report = _check_sync(tmp_path, "uneven", SYNC, "--bug", "uneven-last")
    # the per-step fingerprint (issue 38) may also see rank 0's loader run dry first: the same fault, from the job
    assert proc.returncode == 1 and _serious(report) in (["sampler-uneven-batches"],
                                                         ["divergence", "sampler-uneven-batches"])
    (f,) = [f for f in report["findings"] if f["id"] == "sampler-uneven-batches"]
    assert f["title"].endswith("rank 0: 2, rank 1: 3: uneven last batch")
    assert f["evidence"]["samples_per_rank"] == {"0": 7, "1": 9}


def test_without_ddp_parameters_are_compared(tmp_path):
    proc, report = _check_sync(tmp_path, "noddp", SYNC, "--bug", "no-ddp")
    assert proc.returncode == 1
    (f,) = [f for f in report["findings"] if f["id"] == "param-divergence"]
    assert f["severity"] == "error" and f["evidence"]["step"] == 0 and f["evidence"]["ddp"] is False
    assert "no gradient averaging happens" in f["title"]
    assert set(f["evidence"]["parameters"]) <= {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}

"""Full disks and unwritable outputs (issue 26, item 11): no traceback, one line, and the exit code the job earned.

* 0 bytes free before the launch: the run directory's lock cannot be written -> one line, exit 2 (was an ENOSPC
  traceback from launch/runlock.py). Needs root to mount a small tmpfs (else skipped).
* A job that succeeded, and only RUN/report.html cannot be written: exit 0 by the job's verdict with one warning
  line naming the file (was exit 2).
* The disk fills while a real 2-rank gloo job runs (the job's own "checkpoint" fills it at step 5 and it trains on):
  the job is not disturbed, the ranks' status and the manifest's end go into the space ddpdoctor held back
  (rundir/reserve.py), the report says `disk-full` (a warning) and the exit code is the job's, 0. Without the
  reserve (DDPDOCTOR_SPACE_RESERVE_KB=0) the same run read "rank-no-status" (both ranks blamed as killed) and
  "run-unfinished" with exit 1: the failure this fixes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, SCENARIOS, run_cli
from tests.smalldisk import small_disk


def test_disk_that_fills_during_a_real_job_gives_a_complete_verdict(tmp_path: Path) -> None:
    with small_disk("768k") as disk:
        run = disk / "run"
        proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(run),
                       str(SCENARIOS / "fill_disk.py"),
                       env={"FILL_PATH": str(disk / "ckpt.bin"), "STEPS_AFTER": "6", "STEP_SLEEP_S": "0.2"})
        manifest = json.loads((run / "manifest.json").read_text())
        statuses = [json.loads((run / "ranks" / f"rank{r}" / "status.json").read_text()) for r in (0, 1)]
        saved = json.loads((run / "report.json").read_text())
        held = [p.name for p in run.iterdir() if ".reserve." in p.name]
        status = run_cli("status", str(run))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, (proc.stderr[-2000:], report["findings"])
    assert [s["exit_code"] for s in statuses] == [0, 0] and [s["steps_completed"] for s in statuses] == [11, 11]
    assert manifest["finished"] and manifest["exit_code"] == 0 and manifest["disk_full"]["full_after_s"] > 0
    (f,) = [f for f in report["findings"] if f["severity"] != "info"]
    assert f["id"] == "disk-full" and f["severity"] == "warning" and f["evidence"]["job_exit_code"] == 0
    assert saved["findings"] == report["findings"] and held == []  # the reserve is given back
    assert status.returncode == 0 and "finished" in status.stdout, status.stdout + status.stderr


def test_lock_on_a_full_disk_is_one_line() -> None:
    with small_disk("64k") as disk:
        fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:  # full: 0 bytes left
            pass
        finally:
            os.close(fd)
        proc = run_cli("run", "--nproc-per-node", "2", "--out", str(disk / "run"), str(SCENARIOS / "healthy.py"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and ".ddpdoctor.lock" in lines[0], lines


@pytest.mark.slow
def test_profile_exits_by_the_job_when_only_report_html_cannot_be_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir(mode=0o700)
    (out / "report.html").mkdir()  # the one output that cannot be written
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--out", str(out),
                   str(EXAMPLES / "train_mlp.py"), timeout=240)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == (1 if report["status"] == "error" else 0), proc.stderr[-2000:]
    assert report["status"] != "error"
    warned = [ln for ln in proc.stderr.splitlines() if "report.html" in ln]
    assert len(warned) == 1 and warned[0].startswith("ddpdoctor: warning: "), proc.stderr[-2000:]
    assert (out / "report.json").is_file()


@pytest.mark.slow
def test_profile_on_a_disk_that_fills_keeps_its_traces_and_analyze_says_what_is_missing(tmp_path: Path) -> None:
    """The disk fills at step 2, before the profiled window ends: the ranks write their traces into the half of the
    reserve given back to them; `analyze RUN` later says the disk filled (its manifest's disk_full)."""
    with small_disk("1536k") as disk:
        run = disk / "run"
        proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--active", "5", "--out", str(run),
                       str(SCENARIOS / "fill_disk.py"),
                       env={"FILL_PATH": str(disk / "ckpt.bin"), "FILL_AT_STEP": "2",
                            "DDPDOCTOR_SPACE_RESERVE_KB": "512", "STEP_SLEEP_S": "0.3"}, timeout=300)
        traces = sorted(p.name.split(".")[0] for p in (run / "traces").glob("rank*.pt.trace.json.gz"))
        again = run_cli("analyze", "--json", str(run))
    assert "Traceback" not in proc.stderr + again.stderr, (proc.stderr + again.stderr)[-3000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert traces == ["rank0", "rank1"]
    report, later = json.loads(proc.stdout), json.loads(again.stdout)
    assert "disk-full" in [f["id"] for f in report["findings"]]
    assert "disk-full" in [f["id"] for f in later["findings"]] and again.returncode == 0


@pytest.mark.slow
def test_hang_verdict_that_does_not_fit_is_still_acted_on(tmp_path: Path) -> None:
    """RUN/hang.json fails as on a full disk (rundir/artefacts.py's test hook): the watch used to die with the
    write's exception (job SIGKILLed as a ddpdoctor error, exit 2, no report); now the hang is said and acted on,
    the run ends as a hang (exit 1) and the report names what it lacks."""
    run = tmp_path / "run"
    proc = run_cli("run", "--nproc-per-node", "2", "--hang-timeout", "3", "--startup-timeout", "60", "-q", "--json",
                   "--out", str(run), str(SCENARIOS / "stuck_in_data.py"),
                   env={"DDPDOCTOR_TEST_ENOSPC": "*/hang.json"}, timeout=200)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 1 and "hang detected" in proc.stderr, proc.stderr[-2000:]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["ended"]["how"] == "hang" and not (run / "hang.json").exists()
    (full,) = [f for f in json.loads(proc.stdout)["findings"] if f["id"] == "disk-full"]
    assert "hang.json" in [u["path"] for u in full["evidence"]["unwritten"]]

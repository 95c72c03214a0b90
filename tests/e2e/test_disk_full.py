"""Full disks and unwritable outputs (issue 26, item 11): no traceback, one line, and the exit code the job earned.

* 0 bytes free before the launch: the run directory's lock cannot be written -> one line, exit 2 (was an ENOSPC
  traceback from launch/runlock.py). Needs root to mount a small tmpfs (else skipped).
* A job that succeeded, and only RUN/report.html cannot be written: exit 0 by the job's verdict with one warning
  line naming the file (was exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, SCENARIOS, run_cli


def test_lock_on_a_full_disk_is_one_line(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:  # full: 0 bytes left
            pass
        finally:
            os.close(fd)
        proc = run_cli("run", "--nproc-per-node", "2", "--out", str(disk / "run"), str(SCENARIOS / "healthy.py"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
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

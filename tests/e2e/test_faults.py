"""Faults in real jobs (2 gloo ranks): a rank killed by SIGKILL, SIGSEGV or SIGABRT, and --out on a full disk.
Each checks the exit code, the culprit, that no process of the job is left, and that `ddpdoctor analyze RUN`
still reads what was kept (a report, or one line)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.smalldisk import mount_small_tmpfs, unmount
from tests.teardown import settle_run

pytestmark = pytest.mark.slow


def _scenario(tmp_path: Path, name: str) -> Path:
    """The scenario copied under tmp_path, so this test's processes are found by their command line."""
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(SCENARIOS / "_common.py", d)
    return Path(shutil.copy(SCENARIOS / name, d))


def _left_over(marker: Path) -> list[str]:
    """Processes whose command line names ``marker`` (given a moment to be reaped)."""
    for _ in range(20):
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
        alive = [line for line in ps if str(marker) in line and "ps -eo" not in line]
        if not alive:
            return []
        time.sleep(0.5)
    return alive


def _analyze_reads(run: Path) -> None:
    r = run_cli("analyze", str(run))
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 1) or (r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1), r.stderr


@pytest.mark.parametrize("sig", ["KILL", "SEGV", "ABRT", "TERM"])
def test_rank_killed_by_a_signal_is_the_culprit(tmp_path: Path, sig: str) -> None:
    script = _scenario(tmp_path, "rank_signal.py")
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), str(script),
                   env={"FAULT_SIGNAL": sig, "SCENARIO_GLOO_TIMEOUT": "60"}, timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    # Rank 1 is the only rank blamed; rank 0's connection error is the consequence. Whether rank 0 lived to write
    # that error before the job was stopped depends on timing: with it, rank 1 is the crash that "failed first"
    # (rank 0 its victim); without it, rank 1 is the rank that "ended without a status", or, where its own stderr
    # says why it died (SEGV: "Fatal Python error"), the crash that "failed", with no victim to name.
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and all(f["ranks"] == [1] for f in errors), report["findings"]
    crashed = [f for f in errors if f["id"] == "rank-crashed"]
    if crashed:
        victims = crashed[0]["evidence"]["victims"]
        assert victims in ([], [0]) and "died" in crashed[0]["title"], crashed
        assert ("failed first" in crashed[0]["title"]) == (victims == [0]), crashed
    else:
        assert [f["id"] for f in errors] == ["rank-no-status"], report["findings"]
    assert _left_over(script.parent) == []
    _analyze_reads(out)




@pytest.mark.parametrize("stage", ["early", "late"])
def test_out_on_a_full_disk_is_one_line_and_keeps_what_fitted(tmp_path: Path, stage: str) -> None:
    # early: a real 40k tmpfs fills up while the ranks write. late: the disk fills up exactly when the report is
    # written (injected at the file layer; a real tmpfs sized for that moment fits or not with the trace's size).
    script = _scenario(tmp_path, "healthy.py")
    mounted = None if stage == "late" else mount_small_tmpfs("40k")
    disk = mounted or tmp_path / "disk"
    env = {}
    if mounted is None:
        # The artefact writer fails as a full disk would (rundir/artefacts.py hook).
        env["DDPDOCTOR_TEST_ENOSPC"] = "*/report.json" if stage == "late" else "*/status.json"
    try:
        out = disk / "run"
        # A fixed window (not --active auto, whose length varies) so that what is written, and where the disk fills
        # up, is the same from run to run.
        proc = run_cli("profile", "--nproc-per-node", "2", "--active", "10", "--out", str(out), str(script), env=env,
                       timeout=240)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        settle_run(proc, out)  # torch's teardown abort alone is forgiven (tests/teardown.py)
        if not env or stage == "late":
            # The job was healthy: its verdict is the exit code; each file that did not fit is one line naming it.
            assert proc.returncode == 0, proc.stderr[-3000:]
            said = [ln for ln in proc.stderr.splitlines() if ln.startswith("ddpdoctor: ")]
            assert said and all("No space left on device" in ln for ln in said), said
            assert any("report.json" in ln and ln.startswith("ddpdoctor: warning: ") for ln in said), said
        assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
        assert (out / "manifest.json").is_file()  # what fitted is kept
        assert _left_over(script.parent) == []
        _analyze_reads(out)
    finally:
        if mounted is not None:
            unmount(mounted)

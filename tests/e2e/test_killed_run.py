"""ddpdoctor killed with SIGKILL mid-run (issue 26, item 12): `analyze` of its run says the run is unfinished (not
"ok"), and `status` says so with exit 1 (not "starting" or "running" forever)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, SCENARIOS, run_cli

pytestmark = pytest.mark.slow


def test_analyze_and_status_of_a_run_whose_ddpdoctor_was_killed(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "profile", "--nproc-per-node", "2", "-q", "--run-to-completion",
         "--out", str(out), str(SCENARIOS / "long_training.py")],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(list((out / "traces").glob("*.pt.trace.json*"))) < 2:
            assert proc.poll() is None, "profile ended before its traces were written"
            time.sleep(0.5)
        assert len(list((out / "traces").glob("*.pt.trace.json*"))) == 2
        time.sleep(1.0)  # the traces are complete files (written then renamed); let the probes settle
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert json.loads((out / "manifest.json").read_text())["ended"]["how"] == "running"
    time.sleep(2.0)  # the ranks die with their watcher (PR_SET_PDEATHSIG)

    analyzed = run_cli("analyze", "--json", str(out))
    assert analyzed.returncode in (0, 1), analyzed.stderr
    report = json.loads(analyzed.stdout)
    assert report["status"] != "ok"
    unfinished = [f for f in report["findings"] if f["id"] == "run-unfinished"]
    assert unfinished and "SIGKILL" in unfinished[0]["title"]

    st = run_cli("status", str(out))
    assert st.returncode == 1 and "unfinished" in st.stdout and "starting" not in st.stdout, st.stdout + st.stderr
    st_json = run_cli("status", "--json", str(out))
    assert json.loads(st_json.stdout)["state"] == "unfinished"

"""A real 2-rank gloo job whose rank 1 aborts at interpreter exit after finishing (tests/scenarios/abort_at_exit.py,
the way torch 2.13's gloo sometimes does): `run` keeps torchrun's exit code 1 and says why, with the rank, the
signal and the steps done (docs/findings.md#job-aborted-after-finish); before, it said `ok` with exit 1."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import SCENARIOS, run_cli
from tests.teardown import settle


def test_run_names_the_rank_that_aborted_after_finishing(tmp_path: Path) -> None:
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / "run"),
                   str(SCENARIOS / "abort_at_exit.py"), env={"SCENARIO_STEPS": "5"})
    assert "Traceback" not in proc.stdout
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr[-2000:]  # torchrun's verdict, kept
    assert report["status"] == "warning" and report["job"]["exit_code"] == 1
    (f,) = [f for f in report["findings"] if f["severity"] in ("warning", "error")]
    assert f["id"] == "aborted-after-finish" and f["ranks"] == [1]
    assert f["evidence"]["signals"] == {"1": "SIGABRT"} and f["evidence"]["steps_completed"] == {"1": 5}
    assert settle(proc.returncode, report)[0] == 0  # what the e2e tests' shared helper forgives

"""A rank that returns while the others wait for it in a collective is the culprit (issues 12.4, 16.5): named with
its call site and step; the waiting rank's "Connection closed by peer" is the consequence, not a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.e2e.test_hang_scenarios import site

pytestmark = pytest.mark.slow


def test_a_rank_that_exits_0_early_is_the_culprit_not_the_rank_waiting_for_it(tmp_path: Path) -> None:
    env = {"PAUSE_RANK": "0", "PAUSE_STEP": "4", "PAUSE_KIND": "exit0", "STEPS": "8"}
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / "run"),
                   str(SCENARIOS / "pause.py"), env=env, timeout=180)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    ids = [f["id"] for f in report["findings"]]
    assert "rank-crashed" not in ids  # rank 1's connection error is not a crash of its own
    (left,) = [f for f in report["findings"] if f["id"] == "rank-left-early"]
    assert left["ranks"] == [0] and left["severity"] == "error"
    ev = left["evidence"]
    assert ev["exit_code"] == 0 and ev["step"] == 4 and ev["victims"] == [1]
    assert ev["call_site"] == site("pause", "raise SystemExit(0)")
    assert ev["waiting_in"]["1"]["call_site"] == site("pause", "loss.backward()")

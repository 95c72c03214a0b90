"""A real 2-rank launch prints its progress on stderr when progress is on (forced here: the test has no TTY)."""

from __future__ import annotations

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.teardown import settle_run

pytestmark = pytest.mark.slow


def test_run_prints_ranks_connected_and_steps(tmp_path):
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--out", str(tmp_path / "run"), str(SCENARIOS / "healthy.py"),
                   env={"DDPDOCTOR_PROGRESS": "1"})
    settle_run(proc, tmp_path / "run")  # torch's teardown abort alone is forgiven (tests/teardown.py)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ddpdoctor: ")]
    assert lines[0].startswith("ddpdoctor: starting 2 rank(s)")
    assert "ddpdoctor: 2/2 rank(s) connected" in lines
    assert any(line.startswith("ddpdoctor: steps seen: rank 0 ") for line in lines), lines
    assert "ddpdoctor" not in proc.stdout.split("ddpdoctor run:")[0]  # progress never on stdout

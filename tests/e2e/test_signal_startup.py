"""SIGTERM to one rank during start-up (issue 26, item 10): that rank is the culprit, not the peer torchrun stopped
afterwards (which left no status), and the verdict is an error with exit 1, never "ok"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import SCENARIOS, run_cli

pytestmark = pytest.mark.slow

SCRIPT = '''import os, signal
if os.environ.get("RANK") == "1":
    os.kill(os.getpid(), signal.SIGTERM)  # before init_process_group: rank 0 waits for it at the rendezvous
exec(open(os.path.join(os.path.dirname(__file__), "healthy.py")).read())
'''


def test_sigterm_to_one_rank_at_start_up_blames_that_rank(tmp_path: Path) -> None:
    for name in ("healthy.py", "_common.py"):
        shutil.copy(SCENARIOS / name, tmp_path / name)
    (tmp_path / "startup_term.py").write_text(SCRIPT)
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / "run"),
                   str(tmp_path / "startup_term.py"), env={"SCENARIO_GLOO_TIMEOUT": "30"}, timeout=240)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["status"] == "error"
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [(f["id"], f["ranks"]) for f in errors] == [("rank-crashed", [1])], report["findings"]
    assert "killed by SIGTERM" in errors[0]["title"]

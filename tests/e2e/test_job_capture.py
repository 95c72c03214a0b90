"""`status` and `capture` job-wide through the job store (issue 24): two launchers on one host stand in for two nodes,
each with its own --out (no shared filesystem). `status --json` of the head's run directory lists all 4 ranks;
`capture --profile` and `--stacks` on the head reach node 1's ranks: the head forwards the request through the store,
node 1's ranks write their window into node 1's run directory, and node 1 sends each rank's part back to the head,
which writes it into its own window folder (job/capture_relay.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, SCENARIOS, run_cli
from tests.e2e.test_multinode import _port, finish

pytestmark = pytest.mark.slow


def test_status_and_capture_reach_every_node_without_a_shared_filesystem(tmp_path: Path) -> None:
    outs, port, stop = [tmp_path / "n0", tmp_path / "n1"], _port(), tmp_path / "stop"
    env = dict(os.environ, PYTHONUNBUFFERED="1", DDPDOCTOR_JOB_TOKEN="a-secret-every-node-has")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "ddpdoctor", "run", "--nnodes", "2", "--node-rank", str(n), "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--startup-timeout", "300", "-q", "--json",
         "--out", str(outs[n]), str(SCENARIOS / "live_job.py"), "--steps", "20", "--until-file", str(stop)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(2)]
    try:
        seen: list[str] = []
        deadline = time.time() + 240
        while time.time() < deadline and all(p.poll() is None for p in procs):
            st = run_cli("status", "--json", str(outs[0]), timeout=60)
            health = (json.loads(st.stdout).get("health") or {}) if st.returncode == 0 and st.stdout.strip() else {}
            seen = sorted(health.get("ranks") or {})
            if seen == ["0", "1", "2", "3"] and (health.get("step") or 0) >= 8:
                break
            time.sleep(1.0)
        assert seen == ["0", "1", "2", "3"], [p.poll() for p in procs]
        assert not (outs[0] / "live" / "node1").exists()  # nothing of node 1 came through a filesystem

        cap = run_cli("capture", str(outs[0]), "--profile", "2", "--json", "--timeout", "150", "--fail-on", "none",
                      timeout=240)
        assert cap.returncode == 0, cap.stderr[-3000:]
        rep = json.loads(cap.stdout)
        assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1, 2, 3], rep["ranks"]
        window = Path(rep["run_dir"])
        assert window.parent == outs[0] / "captures"
        traces = sorted(p.name.split(".")[0] for p in (window / "traces").glob("rank*.pt.trace.json.gz"))
        assert traces == ["rank0", "rank1", "rank2", "rank3"]
        # Node 1's ranks wrote their part into node 1's own run directory; the head holds a copy.
        theirs = outs[1] / "captures" / window.name
        assert sorted(p.name.split(".")[0] for p in (theirs / "traces").glob("rank*.pt.trace.json.gz")) == \
            ["rank2", "rank3"]
        firsts = {json.loads((window / "ranks" / f"rank{r}" / "done.json").read_text())["first_step"]
                  for r in range(4)}
        assert len(firsts) == 1, rep.get("notes")  # every rank of both nodes profiled the same iterations
        relayed = json.loads((window / "capture-node1.json").read_text())
        assert relayed["ranks"] == [2, 3] and relayed["relayed_from"]["node"] == 1

        stacks = run_cli("capture", str(outs[0]), "--stacks", "--timeout", "60", timeout=120)
        assert stacks.returncode == 0, stacks.stdout + stacks.stderr
        sdir = outs[0] / "captures"
        (node1_stacks,) = [json.loads(p.read_text()) for p in sdir.glob("*/stacks-node1.json")]
        assert sorted(node1_stacks["stacks"]) == ["2", "3"] and all(node1_stacks["stacks"].values())
        assert "live_job.py" in stacks.stdout
    finally:
        stop.write_text("")
    results = finish(procs, timeout=240)
    for code, so, err in results:
        assert code == 0, err[-3000:]
        assert json.loads(so)["status"] in ("ok", "warning"), so[-2000:]

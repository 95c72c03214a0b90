"""A real step-less trace (issue 27): the profiler used as its recipe's first example does, `with profile() as prof:`
around training iterations with no schedule and no `prof.step()`, on a real 2-rank gloo DDP job under plain
torchrun. `analyze` reads it as a trace (exit 0), gives the whole-trace figures and keeps every per-step rule quiet.
(tests/unit/test_stepless_traces.py covers the bundled and ../shared traces with their steps stripped.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import SCENARIOS, run_cli

pytestmark = pytest.mark.slow


def test_a_real_trace_without_profiler_steps_gives_whole_trace_figures(tmp_path) -> None:
    out = tmp_path / "traces"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(SCENARIOS / "stepless_profile.py"), "--out", str(out), "--iters", "8"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = sorted(out.glob("rank*.pt.trace.json"))
    assert len(traces) == 2
    assert not any("ProfilerStep" in p.read_text() for p in traces)  # the premise: a trace with no steps
    r = run_cli("analyze", str(out), "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert [(f["id"], f["severity"]) for f in doc["findings"]] == [("no-profiler-steps", "info")]
    ev = doc["findings"][0]["evidence"]
    # every gloo all_reduce of one rank is matched with the other's (8 iterations of DDP's buckets, and its start)
    assert ev["ranks"] == 2 and ev["collectives"] == 2 * ev["matched_collectives"] >= 2 * 8
    assert 0.0 <= ev["overlap_pct"] <= 100.0 and ev["comm_ms_by_rank"]["min"] > 0
    assert any("prof.step()" in n for n in doc["notes"])

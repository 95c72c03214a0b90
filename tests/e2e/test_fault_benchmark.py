"""The fault benchmark's quick tier (benchmarks/faults/, issue 41) as CI runs it: two real 2-rank gloo launches
under ddpdoctor (a rank stuck in I/O, a healthy job; crashes are tested in test_faults.py and
test_hang_scenarios.py) and the simulated 1,024/32,768-rank job rules. The benchmark must run end to end and write its table; its canaries must be judged right (a wrong answer
here is a regression of ddpdoctor's verdict, the full tier measures the rest). Nothing here depends on a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

RUN = REPO / "benchmarks" / "faults" / "run.py"


def test_quick_tier_runs_and_scores_its_canaries(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(RUN), "--tier", "quick", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    runs = {o["scenario"]: o for o in results["ddpdoctor"]}
    assert set(runs) == {"hang-stuck-io-2r", "healthy-plain-2r"}
    o = runs["hang-stuck-io-2r"]
    assert o["judged"]["culprit_ok"] and o["judged"]["class_ok"], o
    assert o["fault_at"] is not None and o["time_to_verdict_s"] is not None, o  # the fault mark was read
    assert runs["healthy-plain-2r"]["judged"]["false_alarm"] is False, runs["healthy-plain-2r"]
    table = (tmp_path / "table.md").read_text()
    assert "| ddpdoctor |" in table and "hang-stuck-io-2r" in table


def test_simulated_tier_judges_1024_and_32768_ranks(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(RUN), "--tier", "simulated", "--out", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (outs,) = json.loads((tmp_path / "results.json").read_text()).values()
    assert {o["scenario"].rsplit("-", 1)[1] for o in outs} == {"1024", "32768"}
    wrong = [o for o in outs if o["judged"]["culprit_ok"] is False or o["judged"]["class_ok"] is False
             or o["judged"]["false_alarm"]]
    assert not wrong, wrong


def test_list_prints_one_scenario_a_line_and_gpu_tier_skips_without_a_gpu() -> None:
    p = subprocess.run([sys.executable, str(RUN), "--list"], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and len(lines) >= 40 and all(len(ln.split("\t")) == 6 for ln in lines)
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"]
    if subprocess.run(probe, capture_output=True, text=True, timeout=120).stdout.strip() == "True":
        pytest.skip("a GPU is here: the GPU tier would run for real (benchmarks/faults/gpu_tier.py)")
    g = subprocess.run([sys.executable, str(RUN), "--tier", "gpu"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert g.returncode == 0 and g.stdout.startswith("gpu tier: no CUDA GPU"), g.stdout + g.stderr
    assert len(g.stdout.strip().splitlines()) == 1, g.stdout

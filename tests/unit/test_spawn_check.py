"""A script that starts its own ranks (torch.multiprocessing.spawn / start_processes) is recognised before anything
is launched, with one line saying what would happen and how to run it instead (issue 27: it waited the 600 s
start-up timeout and blamed the network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.launch.spawn_check import spawn_call
from tests.conftest import SCENARIOS, run_cli


@pytest.mark.parametrize(("source", "call"), [
    ("import torch.multiprocessing as mp\nmp.spawn(f, nprocs=2)\n", "mp.spawn"),
    ("import torch\ntorch.multiprocessing.spawn(f, nprocs=2)\n", "torch.multiprocessing.spawn"),
    ("from torch.multiprocessing import spawn\nspawn(f, nprocs=2)\n", "spawn"),
    ("from torch import multiprocessing as tmp\ntmp.start_processes(f, nprocs=2, start_method='fork')\n",
     "tmp.start_processes"),
])
def test_spawn_calls_are_found(tmp_path: Path, source: str, call: str) -> None:
    p = tmp_path / "s.py"
    p.write_text("def f(rank):\n    pass\n" + source)
    assert spawn_call(p) == (len(source.splitlines()) + 2, call)


@pytest.mark.parametrize("source", [
    "import multiprocessing as mp\nmp.Process(target=print).start()\n",  # the stdlib, not ranks
    "import torch.multiprocessing as mp\nq = mp.Queue()\n",
    "def spawn(x):\n    return x\nspawn(1)\n",  # a function of the script's own
    "this is not python (",
])
def test_other_scripts_are_not_spawners(tmp_path: Path, source: str) -> None:
    p = tmp_path / "s.py"
    p.write_text(source)
    assert spawn_call(p) is None


@pytest.mark.parametrize("argv", [
    ["profile", "--nproc-per-node", "2"],
    ["check-sync", "--nproc-per-node", "2"],
    ["run", "--launcher", "none"],
])
def test_pytorch_examples_multigpu_style_script_is_refused_at_once(tmp_path: Path, argv: list[str]) -> None:
    # (before: it waited the 600 s start-up timeout; run_cli's own 240 s timeout would fail this test)
    proc = run_cli(*argv, "--out", str(tmp_path / "run"), str(SCENARIOS / "spawn_multigpu.py"))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "line 35 starts the ranks itself (mp.spawn)" in err[0] and "torchrun form" in err[0]

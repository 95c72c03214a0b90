"""`ddpdoctor profile --nccl-debug` on a real 2-rank gloo job: NCCL env reaches the ranks, report says nccl-not-used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, run_cli
from tests.teardown import settle_cli

pytestmark = pytest.mark.slow


def test_profile_nccl_debug_on_gloo(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli("profile", "--nccl-debug", "--nproc-per-node", "2", "--out", str(out), "--json", "--quiet",
                   str(EXAMPLES / "train_mlp.py"), "--epochs", "1")
    report = settle_cli(proc, json.loads(proc.stdout))  # torch's teardown abort alone is forgiven
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert report["topology"]["nccl_used"] is False and report["topology"]["backend"] == "gloo"
    assert "nccl-not-used" in {f["id"] for f in report["findings"]}
    info = json.loads((out / "ranks" / "rank1" / "info.json").read_text())
    assert "NCCL_DEBUG" in json.dumps(info)  # the ranks ran with the capture environment
    # each rank its own topology dump path (NCCL writes it from the rank NCCL_TOPO_DUMP_FILE_RANK names)
    assert info["env"]["NCCL_TOPO_DUMP_FILE"].endswith("ranks/rank1/nccl_topo.xml")
    # the run directory can be checked again later with `ddpdoctor topo RUN`
    again = run_cli("topo", str(out), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["findings"][0]["id"] == "nccl-not-used"

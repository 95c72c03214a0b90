"""--nccl-debug capture helpers: the rank environment and reading a run directory's NCCL output."""

from __future__ import annotations

import shutil
from pathlib import Path

from ddpdoctor.topo.capture import analyze_run_dir, rank_env, run_backend

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def test_rank_env(tmp_path: Path) -> None:
    env = rank_env(tmp_path, 3)
    assert env == {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,GRAPH",
        "NCCL_TOPO_DUMP_FILE": str(tmp_path / "ranks" / "rank3" / "nccl_topo.xml"),
    }
    assert (tmp_path / "ranks" / "rank3").is_dir()
    assert rank_env(tmp_path, 0, debug_file=True)["NCCL_DEBUG_FILE"].endswith("ranks/rank0/nccl_debug.%h.%p.log")


def test_gloo_run_has_nothing_to_check(tmp_path: Path) -> None:
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    (tmp_path / "ranks" / "rank0" / "stdout.log").write_text("epoch 0 loss 2.3\n")
    section, findings = analyze_run_dir(tmp_path, "gloo")
    assert section["nccl_used"] is False and section["backend"] == "gloo"
    assert [f.id for f in findings] == ["nccl-not-used"] and findings[0].severity.value == "info"
    section, findings = analyze_run_dir(tmp_path, None)  # backend unknown: decided by the output
    assert [f.id for f in findings] == ["nccl-not-used"] and "no NCCL lines" in section["reason"]


def test_nccl_run_dir_is_analysed(tmp_path: Path) -> None:
    for rank in (0, 1):
        d = tmp_path / "ranks" / f"rank{rank}"
        d.mkdir(parents=True)
        (d / "stderr.log").write_text("")
    shutil.copy(FIX / "slurm_ib_nodevice_socket_fallback.log", tmp_path / "ranks" / "rank0" / "stdout.log")
    shutil.copy(FIX / "topo_numa_mismatch_gdr_off.xml", tmp_path / "ranks" / "rank0" / "nccl_topo.xml")
    tr = tmp_path / "torchrun" / "abc" / "attempt_0" / "1"
    tr.mkdir(parents=True)
    (tr / "stdout.log").write_text("node-18:30501:30540 [0] NCCL INFO NCCL_DEBUG_SUBSYS set by environment to INIT\n")
    (tmp_path / "ranks" / "rank1" / "nccl_debug.node-18.30501.log").write_text(
        "node-18:30501:30540 [0] NCCL INFO NCCL_IB_HCA set to mlx5_9\n")
    section, findings = analyze_run_dir(tmp_path, "cpu:gloo,cuda:nccl")
    ids = {f.id for f in findings}
    assert section["nccl_used"] is True and section["summary"]["nodes"] == 2
    assert {"net-socket-internode", "nic-numa-mismatch"} <= ids
    assert len(section["inputs"]["logs"]) == 3 and section["topology"][0]["file"].endswith("nccl_topo.xml")
    assert section["hosts"][1]["env"] == {"NCCL_DEBUG_SUBSYS": "INIT", "NCCL_IB_HCA": "mlx5_9"}


def test_run_backend(tmp_path: Path) -> None:
    assert run_backend(tmp_path) is None
    (tmp_path / "manifest.json").write_text('{"backend": "nccl"}')
    assert run_backend(tmp_path) == "nccl"

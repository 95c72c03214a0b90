"""ddpdoctor preflight for real: torchrun with 2 gloo ranks, and --launcher none with the variables set by hand."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.preflight.nccltable import parse_table
from tests.conftest import run_cli
from tests.ports import reserve_port

pytestmark = pytest.mark.slow


def _free_port() -> int:
    return reserve_port()  # reserved until the server binds it (tests/ports.py), not bound and released


def _hand_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def _checks(proc) -> dict[str, dict]:
    data = json.loads(proc.stdout)
    assert data["tool"] == "ddpdoctor" and data["command"] == "preflight"
    return {c["id"]: c for c in data["checks"]}


def test_healthy_two_ranks(tmp_path):
    # --slow-rank-share 0.9: this machine is shared by parallel tests, and a timing verdict must not decide the
    # test; the slow-rank rule itself is tested with hand-made numbers in tests/unit/test_preflight_merge.py.
    proc = run_cli("preflight", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--checkpoint-dir",
                   str(tmp_path / "ckpt"), "--slow-rank-share", "0.9", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = _checks(proc)
    not_passed = {k: (c["status"], c["summary"]) for k, c in checks.items() if c["status"] != "pass"}
    assert not_passed == {"gpu_health": ("skipped", "no GPU"), "nccl_topology": ("skipped", "NCCL not used (gloo)")}
    assert checks["collectives"]["evidence"]["per_rank"]["0"]["ops_checked"] == [
        "all_gather", "all_reduce", "broadcast", "reduce_scatter"]
    rows = checks["allreduce_bandwidth"]["evidence"]["rows"]
    assert [r["size_bytes"] for r in rows] == [1024 << k for k in range(17)]  # 1 KB .. 64 MB on CPU
    assert all(r["busbw_gbps"] == pytest.approx(r["algbw_gbps"]) for r in rows)  # 2 ranks: factor 1
    assert set(checks["clock_skew"]["evidence"]["offsets"]) == {"1"}
    table = parse_table(json.loads(proc.stdout)["bandwidth_table"])
    assert [r.size_bytes for r in table.rows] == [r["size_bytes"] for r in rows]
    assert not (tmp_path / "ckpt").exists()  # the test directory was created and removed again
    for rank in (0, 1):
        assert json.loads((tmp_path / "run" / "ranks" / f"rank{rank}" / "preflight.json").read_text())["finished"]


def test_impossible_min_busbw_fails(tmp_path):
    proc = run_cli("preflight", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--min-busbw", "1e6",
                   "--max-size", "64K", "--slow-rank-share", "0.9", "--json", timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    checks = _checks(proc)
    assert {k for k, c in checks.items() if c["status"] == "fail"} == {"allreduce_bandwidth"}
    assert "< --min-busbw 1e+06 GB/s" in checks["allreduce_bandwidth"]["summary"]
    findings = json.loads(proc.stdout)["findings"]
    assert [f["id"] for f in findings] == ["preflight.allreduce_bandwidth"]


def test_launcher_none_one_rank(tmp_path):
    proc = run_cli("preflight", "--launcher", "none", "--out", str(tmp_path / "run"), "--max-size", "1M", "--json",
                   env=_hand_env(0, 1, _free_port()), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = _checks(proc)
    assert checks["rendezvous"]["status"] == "pass" and checks["collectives"]["status"] == "pass"
    assert checks["allreduce_bandwidth"]["status"] == "skipped"  # one rank: no link to measure
    assert checks["launcher_env"]["evidence"]["world_size"] == 1


def test_unwritable_checkpoint_dir_fails(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")  # we run as root: a file where a directory is expected is what stops us
    proc = run_cli("preflight", "--launcher", "none", "--out", str(tmp_path / "run"), "--max-size", "1M",
                   "--checkpoint-dir", str(blocker / "ckpt"), "--json", env=_hand_env(0, 1, _free_port()), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    checks = _checks(proc)
    assert {k for k, c in checks.items() if c["status"] == "fail"} == {"checkpoint_dir"}
    assert "Not a directory" in checks["checkpoint_dir"]["summary"]


def test_closed_port_is_diagnosed_as_port(tmp_path):
    port = _free_port()  # bound and released: nothing listens there
    proc = run_cli("preflight", "--launcher", "none", "--out", str(tmp_path / "run"), "--check-timeout", "2",
                   "--json", env=_hand_env(1, 2, port), timeout=60)
    assert proc.returncode == 1, proc.stderr[-3000:]
    row = _checks(proc)["rendezvous"]
    assert row["status"] == "fail" and row["evidence"]["likely_cause"] == "port"
    assert row["summary"].startswith(f"likely cause: port to 127.0.0.1:{port}")
    assert row["evidence"]["seconds"]["1"] < 2 + 10  # the timeout applied (generous margin for a loaded machine)


def test_rank_that_never_joins_is_named(tmp_path):
    proc = run_cli("preflight", "--launcher", "none", "--out", str(tmp_path / "run"), "--check-timeout", "2",
                   "--json", env=_hand_env(0, 2, _free_port()), timeout=60)
    assert proc.returncode == 1, proc.stderr[-3000:]
    row = _checks(proc)["rendezvous"]
    assert row["evidence"]["likely_cause"] == "peers" and row["evidence"]["ranks_that_did_not_join"] == [1]
    assert row["ranks"] == [0, 1]


def test_stuck_rank_does_not_hang_preflight(tmp_path):
    # Rank 1 hangs in the compute check: rank 0's barrier times out (process-group timeout, 2 s), rank 1's watchdog
    # ends it after 2 x 2 + 5 s, and every later check is skipped instead of waiting.
    proc = run_cli("preflight", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--check-timeout", "2",
                   "--max-size", "4K", "--json", env={"DDPDOCTOR_PREFLIGHT_STALL": "1:compute"}, timeout=90)
    assert proc.returncode == 1, proc.stderr[-3000:]
    checks = _checks(proc)
    assert checks["compute"]["status"] == "fail" and checks["compute"]["ranks"] == [0, 1]
    rank1 = json.loads((tmp_path / "run" / "ranks" / "rank1" / "preflight.json").read_text())
    assert rank1["checks"]["compute"]["summary"] == "timed out after 9 s on rank 1"
    assert checks["clock_skew"]["status"] == "skipped"
    assert checks["collectives"]["status"] == "pass"


def test_torchrun_node_rendezvous_to_closed_port(tmp_path):
    # A second node whose master is not up: torchrun itself never starts a rank; preflight bounds torchrun's
    # rendezvous (--rdzv-conf join_timeout) and still says why, with exit code 1.
    port = _free_port()
    proc = run_cli("preflight", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "1", "--master-addr",
                   "127.0.0.1", "--master-port", str(port), "--check-timeout", "1", "--out", str(tmp_path / "run"),
                   "--json", timeout=90)
    assert proc.returncode == 1, proc.stderr[-3000:]
    checks = _checks(proc)
    assert checks["rendezvous"]["status"] == "fail" and checks["rendezvous"]["evidence"]["likely_cause"] == "port"
    assert checks["rendezvous"]["evidence"]["endpoint"] == f"127.0.0.1:{port}"
    assert {c["status"] for k, c in checks.items() if k != "rendezvous"} == {"skipped"}

"""merge: every cross-rank verdict from hand-made rank records, with numbers worked out by hand."""

from __future__ import annotations

import copy

import pytest

from ddpdoctor.preflight.checks import CHECKS, exit_code
from ddpdoctor.preflight.merge import MergeOptions, merge, slow_ranks
from ddpdoctor.preflight.nccltable import make_row
from ddpdoctor.preflight.topology_check import check_topology


def _rec(rank: int, world: int = 2, host: str = "node0", gflops: float = 100.0) -> dict:
    ok = {"status": "pass", "summary": "ok", "evidence": {}}
    rows = [make_row(s, s / 1e3, world).__dict__ for s in (1024, 2048, 4096)]  # 1 GB/s algbw at every size
    checks = {
        "gpu_health": {"status": "skipped", "summary": "no GPU", "evidence": {}},
        "checkpoint_dir": {"status": "pass", "summary": "writable", "evidence": {}},
        "rendezvous": {"status": "pass", "summary": "joined", "evidence": {}, "seconds": 0.1 * (rank + 1)},
        "collectives": ok,
        "allreduce_latency": {"status": "pass", "summary": "50 us", "evidence": {"latency_us": 50.0}},
        "allreduce_bandwidth": {"status": "pass", "summary": "3 sizes", "evidence": {"world_size": world, "rows": rows}},
        "compute": {"status": "pass", "summary": "x", "evidence": {"gflops": gflops}},
        "clock_skew": ({"status": "pass", "summary": "x", "evidence": {"offsets": {
            str(r): {"offset_ms": 0.5, "rtt_ms": 0.1} for r in range(1, world)}}} if rank == 0 else
            {"status": "skipped", "summary": "measured by rank 0", "evidence": {}}),
    }
    return {
        "rank": rank, "world_size": world, "local_rank": rank, "host": host, "backend": "gloo",
        "env": {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "29500"},
        "dist_env": {"NCCL_SOCKET_IFNAME": "eth0"},
        "versions": {"torch": "2.13.0", "cuda": None, "nccl": None, "driver": None, "python": "3.11.9"},
        "devices": {"cuda_available": False, "count": 0, "uuid": None},
        "checks": checks,
    }


def _healthy(world: int = 2) -> dict[int, dict]:
    return {r: _rec(r, world) for r in range(world)}


def _by_id(records, **opts):
    return {c.id: c for c in merge(records, MergeOptions(**opts))}


def test_healthy_everything_passes():
    rows = _by_id(_healthy(), expected_world_size=2)
    assert list(rows) == list(CHECKS)
    assert {k: v.status for k, v in rows.items() if v.status != "pass"} == {
        "gpu_health": "skipped", "nccl_topology": "skipped"}
    assert exit_code(list(rows.values())) == 0
    assert rows["allreduce_bandwidth"].evidence["plateau_busbw_gbps"] == pytest.approx(1.0)


def test_min_busbw_compares_plateau():
    recs = _healthy()
    assert _by_id(recs, min_busbw_gbps=0.99)["allreduce_bandwidth"].status == "pass"
    row = _by_id(recs, min_busbw_gbps=1.01)["allreduce_bandwidth"]
    assert row.status == "fail" and "1.00 GB/s < --min-busbw 1.01" in row.summary
    assert row.finding().id == "preflight.allreduce_bandwidth"


def test_duplicate_host_local_rank_and_world_mismatch():
    recs = _healthy()
    recs[1]["local_rank"] = 0
    recs[1]["world_size"] = 3
    row = _by_id(recs, expected_world_size=2)["launcher_env"]
    assert row.status == "fail" and row.ranks == [0, 1]
    problems = " | ".join(row.evidence["problems"])
    assert "WORLD_SIZE differs" in problems and "share host node0 and LOCAL_RANK 0" in problems


def test_two_ranks_on_one_gpu_and_local_rank_beyond_devices():
    recs = _healthy()
    for r in (0, 1):
        recs[r]["devices"] = {"cuda_available": True, "count": 1, "uuid": "GPU-aaaa"}
    problems = " | ".join(_by_id(recs)["launcher_env"].evidence["problems"])
    assert "LOCAL_RANK 1 >= 1 visible GPUs" in problems
    assert "ranks [0, 1] use the same GPU GPU-aaaa on node0" in problems


def test_version_and_env_differences():
    recs = _healthy()
    recs[1]["versions"]["torch"] = "2.12.0"
    recs[1]["dist_env"]["NCCL_DEBUG"] = "INFO"
    rows = _by_id(recs)
    assert rows["versions"].status == "fail" and rows["versions"].evidence["differing"]["torch"] == {0: "2.13.0", 1: "2.12.0"}
    assert rows["dist_env"].status == "warn"  # only NCCL_DEBUG differs: harmless
    recs[0]["dist_env"]["NCCL_ALGO"] = "Ring"
    row = _by_id(recs)["dist_env"]
    assert row.status == "fail" and "NCCL_ALGO" in row.summary and "NCCL_DEBUG" not in row.summary


def test_slow_rank_by_hand():
    # median of 100, 100, 79 is 100; threshold (1 - 0.2) * 100 = 80: 79 is slow, 80 is not (strictly below)
    assert slow_ranks({0: 100.0, 1: 100.0, 2: 79.0}, 0.2) == ([2], 100.0)
    assert slow_ranks({0: 100.0, 1: 100.0, 2: 80.0}, 0.2) == ([], 100.0)
    recs = {r: _rec(r, 3, gflops=g) for r, g in enumerate([100.0, 100.0, 79.0])}
    row = _by_id(recs)["compute"]
    assert row.status == "fail" and row.ranks == [2] and "21% below the median 100.0" in row.summary


def test_missing_rank_is_named():
    recs = _healthy(3)
    del recs[2]
    rows = _by_id(recs, expected_world_size=3)
    assert rows["rendezvous"].status == "fail"
    assert rows["rendezvous"].evidence["ranks_that_did_not_join"] == [2]
    assert rows["rendezvous"].evidence["likely_cause"] == "peers"
    assert rows["collectives"].status == "fail" and rows["collectives"].ranks == [2]


def test_rendezvous_failure_cause_from_probe():
    recs = {0: _rec(0, 2)}
    recs[0]["checks"] = {"rendezvous": {"status": "fail", "summary": "failed", "evidence": {
        "master_addr": "10.0.0.1", "master_port": 29500, "error": "timed out",
        "probe": {"cause": "firewall", "detail": "no answer before the timeout"}}}}
    rows = _by_id(recs, local_view=True)
    assert rows["rendezvous"].status == "fail"
    assert rows["rendezvous"].summary.startswith("likely cause: firewall to 10.0.0.1:29500")
    assert rows["collectives"].status == "skipped" and "rendezvous failed" in rows["collectives"].summary


def test_collective_failure_on_one_rank():
    recs = _healthy()
    recs[1]["checks"]["collectives"] = {"status": "fail", "summary": "wrong values from all_reduce",
                                        "evidence": {"mismatches": {"all_reduce": {"index": [0]}}}}
    row = _by_id(recs)["collectives"]
    assert row.status == "fail" and row.ranks == [1]


@pytest.mark.parametrize(("offset_ms", "rtt_ms", "status"), [
    (99.0, 0.1, "pass"),
    (-100.1, 0.1, "warn"),  # certain skew 100.1 - 0.05 = 100.05 >= 100
    (-100.1, 0.4, "pass"),  # certain skew 100.1 - 0.2 = 99.9: within measurement error of the threshold
    (150.0, 200.0, "pass"),  # a 200 ms round trip cannot prove 150 ms of skew
    (5000.1, 0.1, "fail"),
])
def test_clock_skew_thresholds(offset_ms, rtt_ms, status):
    recs = _healthy()
    recs[0]["checks"]["clock_skew"]["evidence"]["offsets"]["1"] = {"offset_ms": offset_ms, "rtt_ms": rtt_ms}
    assert _by_id(recs)["clock_skew"].status == status


def test_one_rank_bandwidth_is_skipped():
    recs = {0: _rec(0, 1)}
    assert _by_id(recs, min_busbw_gbps=100.0)["allreduce_bandwidth"].status == "skipped"


def test_topology_rows():
    from ddpdoctor.findings.model import Finding, Severity

    assert check_topology("NCCL not used (gloo)").status == "skipped"
    assert check_topology([]).status == "pass"
    f = Finding("topo.socket_transport", Severity.WARNING, "NET/Socket", ranks=[3])
    row = check_topology([f])
    assert row.status == "warn" and row.ranks == [3]
    info = Finding("topo.summary", Severity.INFO, "2 channels")
    assert check_topology([info]).status == "pass"


def test_topology_input_from_analyze_run_dir_shape():
    from ddpdoctor.findings.model import Finding, Severity
    from ddpdoctor.preflight.topology_check import topology_input

    not_used = ({"nccl_used": False, "reason": "the ranks printed no NCCL lines"}, [])
    assert topology_input(not_used) == "NCCL not used: the ranks printed no NCCL lines"
    f = Finding("topo.x", Severity.ERROR, "x")
    assert topology_input(({"nccl_used": True}, [f])) == [f]
    assert topology_input(object()) == "the topology analysis returned no findings list"


def test_records_are_not_mutated():
    recs = _healthy()
    before = copy.deepcopy(recs)
    merge(recs, MergeOptions(min_busbw_gbps=5.0))
    assert recs == before


def _two_nodes(rate_gbit: float, active: bool = True) -> dict[int, dict]:
    recs = {r: _rec(r, 2, host=f"node{r}") for r in range(2)}
    for rec in recs.values():
        rec["ib_ports"] = [{"device": f"mlx5_{i}", "port": "1", "active": active, "rate_gbit": rate_gbit}
                           for i in range(8)]
    return recs


def test_fabric_floor_by_hand():
    from ddpdoctor.preflight.merge import fabric_floor

    # 8 x 400 Gb/s = 3200 Gb/s = 400 GB/s per node; floor 0.4 x 400 = 160 GB/s
    assert fabric_floor(_two_nodes(400.0))[0] == pytest.approx(160.0)
    assert fabric_floor(_two_nodes(400.0, active=False))[0] is None
    assert fabric_floor(_healthy())[0] is None  # one node
    row = _by_id(_two_nodes(400.0))["allreduce_bandwidth"]  # measured plateau: 1 GB/s
    assert row.status == "fail" and "< fabric floor (0.4 x 3200 Gb/s of ACTIVE IB ports" in row.summary
    # ../shared nccl_tests 01: the healthy bare-metal plateau (488.81) clears the floor, the VM's (57.8) does not
    assert 488.81 > 160.0 > 57.8


def test_finding_evidence_is_compact():
    recs = _healthy(3)
    recs[2]["checks"]["collectives"] = {"status": "fail", "summary": "wrong", "evidence": {"mismatches": {"x": 1}}}
    rows = _by_id(recs, min_busbw_gbps=50.0)
    bw = rows["allreduce_bandwidth"].finding()
    assert "rows" not in bw.evidence and bw.evidence["plateau_busbw_gbps"] == pytest.approx(4 / 3, abs=1e-3)  # 2(3-1)/3
    assert "rows" in rows["allreduce_bandwidth"].to_json()["evidence"]  # the check row keeps the table
    assert list(rows["collectives"].finding().evidence["per_rank"]) == [2]  # only the rank at fault

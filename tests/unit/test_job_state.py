"""Job-wide rules on synthetic node states (ddpdoctor/job/state.py): hang culprit, mismatch, crash root, lost node."""

from __future__ import annotations

import json
import time
from typing import Any

import msgspec

from ddpdoctor.findings.hang import DDP_BUCKETS
from ddpdoctor.job.grouping import parse_ranges
from ddpdoctor.job.state import (
    NodeState,
    compact_reason,
    crash_root,
    diagnose,
    envelope,
    lost_nodes,
    record,
    stalled_ranks,
)

T0 = 1000.0


def beat(step: int, phase: str = "backward", coll: dict[str, Any] | None = None, where: str = "train.py:30",
         started: float = T0, bw_seq: int | None = 40) -> dict[str, Any]:
    b: dict[str, Any] = {"step": step, "phase": phase, "step_started": started, "time": started + 1,
                         "collective": coll, "where": where, "max_step_s": 0.5}
    if phase == "backward" and bw_seq is not None and coll is None:
        b["backward"] = {"group": "default_pg", "seq": bw_seq, "call_site": "train.py:25"}
    return b


def job(nodes: int, per_node: int, special: dict[int, dict[str, Any] | None] | None = None,
        exits: dict[int, dict[str, Any]] | None = None, now: float = T0 + 30) -> dict[int, NodeState]:
    """``nodes`` nodes of ``per_node`` ranks; every rank in DDP's all-reduce at step 6 unless ``special``."""
    special, exits = special or {}, exits or {}
    out = {}
    for n in range(nodes):
        recs = []
        for r in range(n * per_node, (n + 1) * per_node):
            b = special.get(r, beat(6)) if r in special else beat(6)
            recs.append(record(r, b, exits.get(r), now=now, job_started=T0 - 100))
        st = NodeState(n)
        st.update(json.loads(json.dumps(envelope(n, f"host{n}", 1, recs))), now)
        out[n] = st
    return out


def test_record_is_compact_and_carries_what_the_rules_need() -> None:
    rec = record(3, beat(6, phase="data", where="stall.py:11", bw_seq=None), None, now=T0 + 12, job_started=T0 - 50)
    assert msgspec.to_builtins(rec) == {"r": 3, "s": 6, "p": "data", "w": "stall.py:11", "a": 12.0, "l": 11.0,
                                        "m": 0.5}
    coll = {"op": "all_reduce", "group": "default_pg", "seq": 7, "sizes": [[4, 4]], "call_site": "t.py:9"}
    rec = record(0, beat(6, phase="other", coll=coll), None, now=T0 + 1, job_started=T0, active_at=T0 + 0.5)
    assert rec.coll == ["all_reduce", "default_pg", 7, "t.py:9"] and rec.sizes == [[4, 4]] and rec.idle_s == 0.5
    assert len(msgspec.json.encode(rec)) < 160


def test_rank_outside_collective_on_other_node_is_the_culprit_job_wide() -> None:
    # The stall.py: rank 3 (node 1) stuck in data loading; 0, 1 (node 0) and 2 (node 1) wait in DDP.
    nodes = job(2, 2, {3: beat(6, phase="data", where="stall.py:11", bw_seq=None)})
    stalled = stalled_ranks(nodes, T0 + 30, timeout=10, startup_timeout=600)
    assert stalled == [0, 1, 2, 3]
    d = diagnose(nodes, 4, stalled)
    assert d.kind == "outside-collective" and d.culprit_ranks == [3]
    assert d.collective is not None and d.collective["op"] == DDP_BUCKETS
    assert "rank(s) 3 are outside" in d.reason and "0-2 wait" in d.reason


def test_lost_node_ranks_are_culprits() -> None:
    nodes = job(3, 2)
    nodes[2].received = T0 + 5  # its last envelope is 25 s old
    assert lost_nodes(nodes, T0 + 30, after_s=10) == [2]
    nodes[2].lost = True
    stalled = stalled_ranks(nodes, T0 + 30, timeout=10, startup_timeout=600)
    assert stalled == [0, 1, 2, 3]  # a lost node's ranks are not "stalled": they are lost
    d = diagnose(nodes, 6, stalled)
    assert d.kind == "lost-node" and d.culprit_ranks == [4, 5]
    assert "node 2 (host2) stopped publishing" in d.reason and "4-5 lost" in d.reason


def test_finished_node_is_not_lost_and_a_moving_seq_revives() -> None:
    nodes = job(2, 1)
    nodes[1].end = 0
    assert lost_nodes(nodes, T0 + 1000, after_s=10) == [0]
    nodes[0].update(envelope(0, "host0", 2, nodes[0].ranks), T0 + 999)
    assert lost_nodes(nodes, T0 + 1000, after_s=10) == []


def test_mismatch_across_nodes_names_the_minority() -> None:
    coll = {"op": "barrier", "group": "default_pg", "seq": 40, "call_site": "train.py:50"}
    nodes = job(2, 4, {6: beat(6, phase="other", coll=coll)})
    d = diagnose(nodes, 8, list(range(8)))
    assert d.culprit_ranks == [6] and d.kind == "mismatch"


def test_crash_root_job_wide_victims_not_blamed() -> None:
    exits = {2: {"exit_code": 1, "exception": "RuntimeError: boom", "steps_completed": 5},
             0: {"exit_code": 1, "exception": "RuntimeError: Connection closed by peer", "steps_completed": 5},
             1: {"exit_code": 1, "exception": "RuntimeError: Connection reset by peer", "steps_completed": 5}}
    nodes = job(2, 2, exits=exits)
    assert crash_root(nodes) == [2]


def test_junk_records_are_dropped_not_fatal() -> None:
    st = NodeState(0)
    st.update({"seq": 1, "ranks": [{"r": "x"}, 5, None, {"r": 1, "s": 2}], "end": "no"}, T0)
    assert [r.rank for r in st.ranks] == [1] and st.end is None


def test_compact_reason_uses_ranges() -> None:
    assert compact_reason("rank(s) [0, 1, 2, 5] wait; rank(s) [7] left") == "rank(s) 0-2,5 wait; rank(s) 7 left"


def test_4096_ranks_one_hung_named_fast() -> None:
    hung = 2049
    nodes = job(8, 512, {hung: beat(6, phase="data", where="loader.py:77", bw_seq=None)})
    size = len(json.dumps(envelope(0, "h", 1, nodes[0].ranks), separators=(",", ":")))
    assert size / 512 < 200  # bytes per rank per beat
    t = time.perf_counter()
    stalled = stalled_ranks(nodes, T0 + 30, timeout=10, startup_timeout=600)
    d = diagnose(nodes, 4096, stalled)
    elapsed = time.perf_counter() - t
    assert d.culprit_ranks == [hung] and d.kind == "outside-collective"
    assert parse_ranges(d.reason.split("rank(s) ")[1].split(" are")[0]) == [hung]
    assert len(d.reason) < 400
    assert elapsed < 2.0  # generous: ~0.05 s on an idle core


def test_4096_ranks_mismatch_reason_is_grouped() -> None:
    coll = {"op": "all_gather", "group": "default_pg", "seq": 40, "call_site": "eval.py:9"}
    nodes = job(8, 512, {r: beat(6, phase="other", coll=coll) for r in (5, 1000)})
    d = diagnose(nodes, 4096, list(range(4096)))
    assert d.culprit_ranks == [5, 1000]
    assert "ranks 5,1000: all_gather #40" in d.reason and len(d.reason) < 600


def test_one_verdict_builder_for_one_node_and_for_many() -> None:
    # job/verdict.build: the same ranks' records as one node (a lone node's monitor) or as two (the head) give the
    # same verdict; an exited rank's exit site reaches the diagnosis through its record.
    from ddpdoctor.findings.hang import diagnose_hang, position
    from ddpdoctor.job.rules import Limits
    from ddpdoctor.job.verdict import build

    special = {3: beat(6, phase="data", where="stall.py:11", bw_seq=None, started=T0 + 10)}
    many, one = job(2, 2, special), job(1, 4, special)
    v_many = build(many, 4, [0, 1, 2, 3], T0 + 30, limits=Limits(10, 600), timeout_s=10, on_hang="kill", stacks={},
                   dumps={})
    v_one = build(one, 4, [0, 1, 2, 3], T0 + 30, limits=Limits(10, 600), timeout_s=10, on_hang="kill", stacks={},
                  dumps={})
    assert v_one.to_json() == v_many.to_json()
    assert v_one.diagnosis.culprit_ranks == [3] and v_one.diagnosis.kind == "outside-collective"
    # The stalled ranks made no progress since the most recent start of their steps (rank 3's, at T0 + 10).
    assert v_one.detected_after_s == 20.0 and v_one.hang_timeout_set and not v_one.in_startup
    # The records give the positions the raw heartbeats give (findings/hang.position), an exited rank included.
    left = {"exit_code": 0, "exception": None, "steps_completed": 6, "exit_site": "train.py:99"}
    raw = {0: position(0, beat(6), None), 1: position(1, beat(6), left)}
    nodes = job(1, 2, exits={1: left})
    built = build(nodes, 2, [0], T0 + 30, limits=Limits(10, 600), timeout_s=10, on_hang="kill", stacks={}, dumps={})
    assert built.diagnosis.positions == diagnose_hang(raw, [0]).positions
    assert built.diagnosis.positions[1].call_site == "train.py:99"

"""The one stall rule (ddpdoctor/job/rules.py) on synthetic typed records: the same decisions for a job of one node
and of many (the records do not say which node they came from), at 4 and at 32,768 ranks."""

from __future__ import annotations

import msgspec

from ddpdoctor.findings.hang import DDP_BUCKETS
from ddpdoctor.job.record import RankRecord, decode, encode, record
from ddpdoctor.job.rules import Limits, decide

DEFAULT = Limits(None, 600.0, stuck_s=15.0)  # the 60 s floor's rule
EXPLICIT = Limits(30.0, 600.0, stuck_s=15.0)


def waiting(rank: int, age: float = 70.0) -> RankRecord:
    return RankRecord(rank, step=6, phase="backward", coll=[DDP_BUCKETS, "default_pg", 40, "t.py:9"], age_s=age,
                      idle_s=60.0, moved_s=60.0, slowest_s=0.5)


def laggard(rank: int, idle: float | None, age: float = 70.0, moved: float = 60.0) -> RankRecord:
    return RankRecord(rank, step=6, phase="data", where="t.py:20", age_s=age, idle_s=idle, moved_s=moved,
                      slowest_s=0.5)


def job(n: int, special: dict[int, RankRecord]) -> list[RankRecord]:
    return [special.get(r) or waiting(r) for r in range(n)]


def test_a_busy_laggard_is_a_long_stall_and_a_stuck_one_a_hang() -> None:
    busy = decide(job(4, {3: laggard(3, idle=0.4)}), DEFAULT, 500.0, 4)
    assert busy.stalled == [0, 1, 2, 3] and busy.busy == [3] and not busy.hung
    stuck = decide(job(4, {3: laggard(3, idle=16.0)}), DEFAULT, 500.0, 4)
    assert stuck.busy == [] and stuck.hung and stuck.timeout_s == 60.0
    unknown = decide(job(4, {3: laggard(3, idle=None)}), DEFAULT, 500.0, 4)  # never measured: not busy
    assert unknown.hung


def test_the_busy_rank_need_not_be_past_the_timeout_itself() -> None:
    # Its node's record arrived a moment after the others' (or its step started a moment later): the others wait
    # for it all the same.
    d = decide(job(4, {3: laggard(3, idle=0.2, age=59.0)}), DEFAULT, 500.0, 4)
    assert d.stalled == [0, 1, 2] and d.busy == [3] and not d.hung
    ahead = laggard(3, idle=0.2, age=1.0)
    ahead.step = 7  # a rank already past the stalled ones' step is not what they wait for
    assert decide(job(4, {3: ahead}), DEFAULT, 500.0, 4).hung


def test_a_rank_that_just_moved_is_not_hung_yet_and_an_explicit_timeout_is_a_plain_deadline() -> None:
    back = waiting(0)
    back.moved_s = 0.05  # back from a checkpoint, in DDP's all-reduce for milliseconds with its step's start old
    d = decide(job(2, {0: back}), DEFAULT, 500.0, 2)
    assert d.moving == [0] and not d.hung
    assert decide(job(2, {0: back}), EXPLICIT, 500.0, 2).hung
    assert decide(job(4, {3: laggard(3, idle=0.4)}), EXPLICIT, 500.0, 4).hung


def test_a_rank_that_failed_moments_ago_is_being_torn_down() -> None:
    failed = RankRecord(1, step=6, exit=[1, "RuntimeError: boom", 6], exit_age_s=2.0)
    d = decide([waiting(0), failed], EXPLICIT, 500.0, 2)
    assert d.stalled == [0] and d.tearing_down and not d.hung
    failed.exit_age_s = 11.0
    assert decide([waiting(0), failed], EXPLICIT, 500.0, 2).hung


def test_start_up_missing_ranks_and_no_rank_at_all() -> None:
    assert decide([laggard(0, None, age=30.0)], Limits(None, 20.0), 30.0, 2).missing == [1]
    first = RankRecord(0, step=0, age_s=30.0)  # before its first step: the start-up timeout applies
    assert decide([first], Limits(None, 60.0), 30.0, 1).stalled == []
    assert decide([], Limits(None, 20.0), 30.0, 2).stalled == [-1]


def test_the_head_adds_how_long_ago_a_node_published_to_the_step_age() -> None:
    recs = [waiting(0, age=50.0), waiting(1, age=50.0)]
    assert decide(recs, DEFAULT, 500.0, 2).stalled == []
    assert decide(recs, DEFAULT, 500.0, 2, extra_age_s={1: 11.0}).stalled == [1]


def test_the_record_round_trips_compact_and_typed() -> None:
    beat = {"step": 6, "phase": "backward", "step_started": 100.0, "time": 101.0, "where": "t.py:3",
            "backward": {"group": "default_pg", "seq": 40, "call_site": "t.py:9"}, "max_step_s": 0.25,
            "summary": {"comm_s": 0.01, "bad": "x"}}
    rec = record(5, beat, None, now=110.0, job_started=50.0, active_at=109.5, moved_at=104.0)
    assert (rec.coll, rec.age_s, rec.idle_s, rec.moved_s, rec.summary) == (
        [DDP_BUCKETS, "default_pg", 40, "t.py:9"], 10.0, 0.5, 6.0, {"comm_s": 0.01})
    wire = encode([rec, RankRecord(6)])
    assert decode(msgspec.json.decode(msgspec.json.encode(wire))) == [rec, RankRecord(6)]
    assert decode([{"r": "x"}, 5, None, {"r": 7, "i": "soon"}, {"r": 8}]) == [RankRecord(8)]
    assert len(msgspec.json.encode(rec)) < 200


def test_32768_ranks_one_stuck_one_busy() -> None:
    n = 32768
    stuck = decide(job(n, {20000: laggard(20000, idle=40.0)}), DEFAULT, 500.0, n)
    assert stuck.hung and len(stuck.stalled) == n and stuck.busy == []
    busy = decide(job(n, {20000: laggard(20000, idle=0.5)}), DEFAULT, 500.0, n)
    assert not busy.hung and busy.busy == [20000]


def test_a_stall_that_ends_is_not_a_hang_on_a_view_half_old() -> None:
    """CI's 2-node run: rank 3 (node 1) back from its checkpoint is already in the next all-reduce in node 1's fresh
    record, while node 0's record, read a moment before its publication, still shows ranks 0-1 waiting 10 s. That
    view says hung; the gate waits for a view wholly newer than that, where ranks 0-1 have moved on."""
    from ddpdoctor.job.rules import CONFIRM_S, HangGate

    gate = HangGate()
    back = waiting(3, age=0.3)
    back.step, back.moved_s = 7, 0.3
    half_old = [waiting(0), waiting(1), back, waiting(2, age=0.3)]
    d = decide(half_old, DEFAULT, 500.0, 4)
    assert d.hung and d.stalled == [0, 1]  # the rule alone would kill the job here
    assert not gate.confirmed(d, DEFAULT, now=100.0, view_at=99.8)
    fresh = [waiting(r, age=0.2) for r in range(4)]
    assert not gate.confirmed(decide(fresh, DEFAULT, 500.0, 4), DEFAULT, now=100.5, view_at=100.4)
    assert gate.since is None
    # A real hang holds: confirmed once every node's view was taken CONFIRM_S after it was first seen, not before.
    stuck = decide(job(4, {3: laggard(3, idle=16.0)}), DEFAULT, 500.0, 4)
    assert not gate.confirmed(stuck, DEFAULT, now=200.0, view_at=199.9)
    assert not gate.confirmed(stuck, DEFAULT, now=200.0 + CONFIRM_S + 1, view_at=200.0 + CONFIRM_S - 0.1)
    assert gate.confirmed(stuck, DEFAULT, now=200.0 + CONFIRM_S + 1, view_at=200.0 + CONFIRM_S)
    # One node's own records are live: the hang must only hold for CONFIRM_S. An explicit timeout is a deadline.
    one = HangGate()
    assert not one.confirmed(stuck, DEFAULT, now=10.0) and one.confirmed(stuck, DEFAULT, now=10.0 + CONFIRM_S)
    assert HangGate().confirmed(decide(half_old, EXPLICIT, 500.0, 4), EXPLICIT, now=1.0, view_at=0.0)

"""Exposed communication split into waiting for a late peer, transfer and host dispatch, and waits counted once per
moment (issue 28): the worked example of docs/metrics.md#exposed-split, checked by hand."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses import crossrank
from ddpdoctor.analyses.rank import RankResult
from ddpdoctor.analyses.results import CollectiveCall, InputInfo
from ddpdoctor.findings.perf_balance import rule_stragglers
from tests.unit.analysis_builders import analysis, rank, step

# One 100 ms step, 3 ranks, two gradient buckets A and B in flight at once (DDP). Rank 2 arrives 30 ms late at both.
#            launch   start A  start B   ends (A, B)   compute hides communication until
#  rank 0    9 ms     10 ms    20 ms     45, 55 ms     30 ms
#  rank 1    9 ms     10 ms    20 ms     45, 55 ms     30 ms
#  rank 2    39 ms    40 ms    50 ms     45, 55 ms     50 ms
STARTS = {0: (10_000.0, 20_000.0), 1: (10_000.0, 20_000.0), 2: (40_000.0, 50_000.0)}
HIDDEN_UNTIL = {0: 30_000.0, 1: 30_000.0, 2: 50_000.0}


def _result(r: int, steps: int = 1) -> RankResult:
    """The step above, repeated ``steps`` times 100 ms apart."""
    calls, per_step = [], []
    for k in range(steps):
        t0 = 100_000.0 * k
        a, b = (t0 + x for x in STARTS[r])
        for i, (t, end) in enumerate(((a, t0 + 45_000.0), (b, t0 + 55_000.0))):
            calls.append(CollectiveCall(
                rank=r, index=len(calls), step=k + 1, op="all_reduce", group="default_pg", seq=len(calls) + 1,
                bytes=4 << 20, start_us=t, dur_us=end - t, end_us=end, start_rel_backward_us=None, algbw_gbps=None,
                busbw_gbps=None, launch_us=t - 1000.0 if i == 0 else t - 500.0))
        comm = t0 + 55_000.0 - a  # the union of the two collectives
        per_step.append(step(k + 1, start=t0, dur=100_000.0, comm=comm, exposed=55_000.0 - HIDDEN_UNTIL[r]))
    return RankResult(input=InputInfo(path=f"r{r}", rank=r, rank_source="summary", device="cpu", events=0),
                      metrics=rank(r, per_step, world_size=3), calls=calls, buckets=[], grad_ready=[])


def test_worked_example_by_hand() -> None:
    results = [_result(r) for r in range(3)]
    matched = crossrank.match(results)
    assert [m.last_rank for m in matched] == [2, 2] and [m.arrival_skew_us for m in matched] == [30_000.0] * 2
    split = {c.rank: c for c in crossrank.exposed_split(results, matched)}
    # Rank 0 waits at A from 10 to 40 ms and at B from 20 to 50 ms: 60 ms added up, 40 ms once (10 -> 50 ms).
    # Compute hides 10 -> 30 ms of it; exposed: 30 -> 55 ms = 25 ms = 20 ms waiting (30 -> 50) + 5 ms transfer.
    assert split[0].exposed_us == 25_000.0
    assert split[0].wait_us == 20_000.0 and split[0].transfer_us == 5_000.0
    assert split[0].waiting_for_us == {2: 20_000.0}
    # Dispatch: A enqueued at 9 ms, running at 10 ms (1 ms queued with nothing of rank 0 running); B enqueued at
    # 19.5 ms while A ran: not dispatch.
    assert split[0].dispatch_us == 1_000.0
    # Rank 2, the late one: no wait; its exposed 5 ms (50 -> 55) is all transfer.
    assert (split[2].wait_us, split[2].transfer_us, split[2].waiting_for_us) == (0.0, 5_000.0, {})
    # Caused wait counts each moment once: 40 ms per waiting rank, not 60.
    s = crossrank.stragglers(results, matched)
    assert s.caused_wait_us[2] == 80_000.0 and s.last_in_kind[2] == ("all_reduce", 2, 2)


def test_straggler_cost_is_the_exposed_wait_counted_once() -> None:
    results = [_result(r, steps=4) for r in range(3)]  # 8 of 8 collectives: a clear majority
    matched = crossrank.match(results)
    a = analysis([r.metrics for r in results], matched=matched, stragglers=crossrank.stragglers(results, matched),
                 comm_split=crossrank.exposed_split(results, matched))
    (f,) = rule_stragglers(a, None)
    assert f.ranks == [2]
    # (20 ms + 20 ms of exposed wait) / 2 waiting ranks = 20 ms per step (not 30 ms x 2 buckets = 60 ms)
    assert f.evidence["cost_ms_per_step"] == pytest.approx(20.0)
    assert f.evidence["others_exposed_wait_ms_per_step"] == {"2": 20.0}


def test_a_flag_broadcast_with_arrival_by_chance_does_not_dilute_the_gradient_all_reduces() -> None:
    # Lightning: an 8-byte broadcast every step whose last rank is chance, beside the gradient all-reduces where
    # rank 1 is last every time: 11 of 11 all-reduces, 14 of 22 collectives overall.
    from ddpdoctor.analyses.results import MatchedCollective

    matched = []
    for k in range(11):
        t = 100_000.0 * k
        one = k % 4 == 1  # rank 1 last at 3 of the 11 broadcasts, rank 0 at the others, by 0.1 ms
        matched.append(MatchedCollective(key=f"b{k}", op="broadcast", group="g", seq=2 * k, bytes=8,
                                         starts_us={0: t + (0 if one else 100), 1: t + (100 if one else 0)},
                                         ends_us={0: t + 300, 1: t + 300}, arrival_skew_us=100.0,
                                         last_rank=1 if one else 0,
                                         lateness_us={0: 0.0 if one else 100.0, 1: 100.0 if one else 0.0}))
        matched.append(MatchedCollective(key=f"a{k}", op="all_reduce", group="g", seq=2 * k + 1, bytes=1 << 20,
                                         starts_us={0: t + 1000, 1: t + 51_000}, ends_us={0: t + 53_000, 1: t + 53_000},
                                         arrival_skew_us=50_000.0, last_rank=1,
                                         lateness_us={0: 0.0, 1: 50_000.0}))
    results = [RankResult(input=InputInfo(path=f"r{r}", rank=r, rank_source="summary", device="cpu", events=0),
                          metrics=rank(r, [step(k, start=100_000.0 * k, dur=100_000.0) for k in range(11)]),
                          calls=[], buckets=[], grad_ready=[]) for r in range(2)]
    s = crossrank.stragglers(results, matched)
    assert s.last_arrival_count[1] == 14 and s.last_in_kind[1] == ("all_reduce", 11, 11)
    assert s.ranks == [1]
    # 14 of 22 collectives overall is under two thirds: judged over every kind it would not be named
    assert s.last_arrival_count[1] < crossrank.STRAGGLER_MAJORITY * len(matched)

"""Arrival skew counts only the lateness a rank adds by its own work (docs/metrics.md, "Lateness"): numbers worked
out by hand there."""

from __future__ import annotations

from ddpdoctor.analyses import crossrank
from ddpdoctor.analyses.results import MatchedCollective


def _m(starts: dict[int, float], ends: dict[int, float]) -> MatchedCollective:
    return MatchedCollective("k", "all_reduce", "default_pg", None, None, starts, ends, 0.0, 0)


def test_a_rank_that_leaves_a_collective_last_is_not_late_at_the_next():
    prev = _m({0: 0.0, 1: 0.0}, {0: 100.0, 1: 160.0})
    assert crossrank._own_lateness(prev, {0: 600.0, 1: 660.0}) == {0: 0.0, 1: 0.0}
    assert crossrank._own_lateness(prev, {0: 600.0, 1: 760.0}) == {0: 0.0, 1: 100.0}


def test_without_a_sequential_predecessor_lateness_is_the_start_difference():
    assert crossrank._own_lateness(None, {0: 600.0, 1: 660.0}) == {0: 0.0, 1: 60.0}
    # DDP's buckets overlap: the next all_reduce starts before the previous one ended on rank 1.
    overlapping = _m({0: 0.0, 1: 0.0}, {0: 100.0, 1: 700.0})
    assert crossrank._own_lateness(overlapping, {0: 600.0, 1: 660.0}) == {0: 0.0, 1: 60.0}
    # another group's collective (other ranks) is no predecessor
    other = _m({0: 0.0, 2: 0.0}, {0: 100.0, 2: 160.0})
    assert crossrank._own_lateness(other, {0: 600.0, 1: 660.0}) == {0: 0.0, 1: 60.0}

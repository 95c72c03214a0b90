"""Across ranks: match the k-th collective, align clocks on collective ends, arrival skew, who waits for whom,
stragglers, and the bandwidth/latency fit of this run's collectives."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict

import numpy as np

from ddpdoctor.analyses.rank import RankResult
from ddpdoctor.analyses.results import BandwidthFit, CollectiveCall, MatchedCollective, Stragglers

# A rank is a straggler when it makes the others wait at least twice as long as a typical rank does (arrival order
# alone flips at random between healthy ranks), and the excess, per waiting rank, is at least 5% of the recorded
# step time (below that it costs little whoever causes it).
STRAGGLER_DOMINANCE = 2.0
# Last in at least two thirds of the matched collectives (findings/perf_balance.py uses the same rule).
STRAGGLER_MAJORITY = 2 / 3
STRAGGLER_WAIT_SHARE = 0.05


# Point-to-point transfers pair with one peer each (pipeline stages), not with every rank: no arrival skew.
P2P_OPS = {"send", "recv", "send_recv"}


def _key(c: CollectiveCall, k: int) -> str:
    return f"{c.group}:seq{c.seq}" if c.seq is not None else f"{c.group}:#{k}"


def match(results: list[RankResult]) -> list[MatchedCollective]:
    """Same process group and sequence number where the trace has them, else the k-th call of the group."""
    table: dict[str, dict[int, CollectiveCall]] = defaultdict(dict)
    order: list[str] = []
    for r in results:
        per_group: dict[str | None, int] = defaultdict(int)
        for c in r.calls:
            if c.op in P2P_OPS:
                continue
            k = per_group[c.group]
            per_group[c.group] += 1
            key = _key(c, k)
            if key not in table:
                order.append(key)
            table[key][r.metrics.rank] = c
    out: list[MatchedCollective] = []
    for key in order:
        by_rank = table[key]
        if len(by_rank) < 2:
            continue
        first = next(iter(by_rank.values()))
        starts = {rk: c.start_us for rk, c in sorted(by_rank.items())}
        ends = {rk: c.end_us for rk, c in sorted(by_rank.items())}
        late = _own_lateness(out[-1] if out else None, starts)
        last = max(late, key=lambda rk: (late[rk], rk))
        out.append(MatchedCollective(
            key=key, op=first.op, group=first.group, seq=first.seq, bytes=first.bytes, starts_us=starts,
            ends_us=ends, arrival_skew_us=late[last], last_rank=last, lateness_us=late,
        ))
    return out


def _own_lateness(prev: MatchedCollective | None, starts: dict[int, float]) -> dict[int, float]:
    """How late each rank arrives at a collective by its own work. A collective does not end at the same instant
    everywhere (in a ring, one rank receives the last chunk a message later), and a rank that leaves it later
    arrives later at the next one without being slower; blaming that rank would name the collective's own
    completion order as a straggler (on 2-rank gloo: the same rank last in most collectives of a healthy job).
    So when the previous matched collective ran on the same ranks and ended on each before this one started there,
    a rank's lateness is its time between the two (start - previous end) minus the shortest such time; otherwise
    (the first one, overlapping launches such as DDP's buckets, other groups) its start minus the earliest start."""
    if prev is not None and set(prev.ends_us) == set(starts) and all(prev.ends_us[r] <= t for r, t in starts.items()):
        gaps = {r: t - prev.ends_us[r] for r, t in starts.items()}
    else:
        gaps = dict(starts)
    low = min(gaps.values())
    return {r: g - low for r, g in gaps.items()}


def clock_offsets(results: list[RankResult], matched: list[MatchedCollective]) -> tuple[dict[int, float], str | None]:
    """Offset of each rank's clock from the lowest rank's: the median of (end_r - end_ref) over matched collectives,
    since a collective completes at nearly the same instant on every rank. Ranks on one host share a clock: 0."""
    ranks = sorted(r.metrics.rank for r in results)
    if not ranks:
        return {}, None
    hosts = {r.host for r in results}
    if len(hosts) == 1 and None not in hosts:
        return {rk: 0.0 for rk in ranks}, None
    ref = ranks[0]
    offsets = {ref: 0.0}
    note = None
    for rk in ranks[1:]:
        diffs = [m.ends_us[rk] - m.ends_us[ref] for m in matched if rk in m.ends_us and ref in m.ends_us]
        offsets[rk] = float(statistics.median(diffs)) if diffs else 0.0
        if not diffs:
            note = f"rank {rk} shares no collective with rank {ref}: its clock is not aligned"
    return offsets, note


def shift(results: list[RankResult], offsets: dict[int, float]) -> None:
    """Move every timestamp of rank r onto the reference clock (t - offset_r), in place."""
    for r in results:
        d = offsets.get(r.metrics.rank, 0.0)
        if d == 0.0:
            continue
        for c in r.calls:
            c.start_us -= d
            c.end_us -= d
        for b in r.buckets:
            b.start_us -= d
            b.end_us -= d
        for g in r.grad_ready:
            g.t_us -= d
        for sc in r.syncs:
            sc.t_us -= d
        for p in r.metrics.per_step:
            p.start_us -= d
            if p.backward_start_us is not None:
                p.backward_start_us -= d
            if p.backward_end_us is not None:
                p.backward_end_us -= d
            if p.cpu_backward_start_us is not None:
                p.cpu_backward_start_us -= d
            if p.cpu_backward_end_us is not None:
                p.cpu_backward_end_us -= d


def stragglers(results: list[RankResult], matched: list[MatchedCollective]) -> Stragglers:
    caused: dict[int, float] = {r.metrics.rank: 0.0 for r in results}
    last_count: dict[int, int] = {r.metrics.rank: 0 for r in results}
    for m in matched:
        late = m.lateness_us or _own_lateness(None, m.starts_us)  # built without match(): start order
        caused[m.last_rank] += sum(late[m.last_rank] - v for v in late.values())
        last_count[m.last_rank] += 1
    medians = {r.metrics.rank: r.metrics.step_time_us.get("median") for r in results}
    known = [v for v in medians.values() if v is not None]
    step_skew = max(known) - min(known) if len(known) >= 2 else None
    totals = [sum(p.dur_us for p in r.metrics.per_step) for r in results]
    total_step = statistics.median(totals) if totals else 0.0
    all_wait = sum(caused.values())
    flagged: list[int] = []
    n = len(results)
    if n >= 2 and all_wait > 0 and total_step > 0:
        ordered = sorted(caused.values())
        for rk, w in caused.items():
            typical = _median_without(ordered, w)
            excess = (w - typical) / (n - 1)
            # ... and last in a clear majority of the matched collectives (a rank last now and then is noise).
            if (w >= STRAGGLER_DOMINANCE * typical and excess >= STRAGGLER_WAIT_SHARE * total_step
                    and last_count[rk] >= STRAGGLER_MAJORITY * len(matched)):
                flagged.append(rk)
    skews = [m.arrival_skew_us for m in matched]
    return Stragglers(
        ranks=sorted(flagged), caused_wait_us=caused, last_arrival_count=last_count,
        arrival_skew_median_us=statistics.median(skews) if skews else None,
        step_time_skew_us=step_skew, step_time_us_by_rank=medians,
    )


def _median_without(ordered: list[float], v: float) -> float:
    """The median of ``ordered`` (sorted) with one occurrence of ``v`` left out, by index: the same value as
    statistics.median of the others, without building that list for every rank (quadratic in ranks)."""
    i = bisect.bisect_left(ordered, v)
    m = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def bandwidth_fit(calls: list[CollectiveCall]) -> BandwidthFit:
    """dur = latency + bytes / bytes_per_us, least squares over calls of the most frequent op that have bytes.
    With one message size only, latency cannot be separated: latency None and bytes_per_us = median(bytes/dur)."""
    sized = [c for c in calls if c.bytes and c.dur_us > 0]
    if not sized:
        return BandwidthFit(None, None, 0)
    ops: dict[str, int] = defaultdict(int)
    for c in sized:
        ops[c.op] += 1
    op = max(ops, key=lambda o: ops[o])
    pts = [c for c in sized if c.op == op]
    x = np.array([c.bytes for c in pts], dtype=np.float64)
    y = np.array([c.dur_us for c in pts], dtype=np.float64)
    if len(np.unique(x)) >= 2:
        slope, intercept = np.polyfit(x, y, 1)
        if slope > 0:
            return BandwidthFit(float(max(intercept, 0.0)), float(1.0 / slope), len(pts))
    return BandwidthFit(None, float(np.median(x / y)), len(pts))

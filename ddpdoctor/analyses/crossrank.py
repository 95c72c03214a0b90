"""Across ranks: match the k-th collective, align clocks on collective ends, arrival skew, who waits for whom,
stragglers, and the bandwidth/latency fit of this run's collectives."""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict

import numpy as np

from ddpdoctor.analyses.rank import RankResult
from ddpdoctor.analyses.results import BandwidthFit, CollectiveCall, CommSplit, MatchedCollective, Stragglers
from ddpdoctor.traces import intervals as iv

# A rank is a straggler when it makes the others wait at least twice as long as a typical rank does (arrival order
# alone flips at random between healthy ranks), and the excess, per waiting rank, is at least 5% of the recorded
# step time (below that it costs little whoever causes it).
STRAGGLER_DOMINANCE = 2.0
# Last in at least two thirds of the matched collectives (findings/perf_balance.py uses the same rule).
STRAGGLER_MAJORITY = 2 / 3
STRAGGLER_WAIT_SHARE = 0.05


# Collectives of at most this many bytes are "small" (flags, scalars, metadata: Lightning's 8-byte broadcast every
# step), whose arrival order is chance: lateness is judged per kind (op x small/large), weighted by the wait caused.
SMALL_BYTES = 4096

# Point-to-point transfers pair with one peer each (pipeline stages), not with every rank: no arrival skew.
P2P_OPS = {"send", "recv", "send_recv"}


def _key(c: CollectiveCall, k: int) -> str:
    return f"{c.group}:seq{c.seq}" if c.seq is not None else f"{c.group}:#{k}"


def _keyed(results: list[RankResult]) -> list[tuple[int, CollectiveCall, str]]:
    """(rank, call, sequence key) of every group collective (no point-to-point), in each rank's start order."""
    out: list[tuple[int, CollectiveCall, str]] = []
    for r in results:
        per_group: dict[str | None, int] = defaultdict(int)
        for c in r.calls:
            if c.op in P2P_OPS:
                continue
            k = per_group[c.group]
            per_group[c.group] += 1
            out.append((r.metrics.rank, c, _key(c, k)))
    return out


def _uses_comms_id(keyed: list[tuple[int, CollectiveCall, str]]) -> bool:
    """Kineto's "Comms Id" keys the match only where every group collective of every rank carries one."""
    return bool(keyed) and all(c.comms_id is not None for _, c, _ in keyed)


def match(results: list[RankResult]) -> list[MatchedCollective]:
    """Kineto's "Comms Id" where every rank's trace has it (newer torch), else the same process group and sequence
    number where the trace has them, else the k-th call of the group (docs/metrics.md#collective-matching)."""
    keyed = _keyed(results)
    by_id = _uses_comms_id(keyed)
    table: dict[str, dict[int, CollectiveCall]] = defaultdict(dict)
    order: list[str] = []
    for rank, c, seq_key in keyed:
        key = f"id:{c.comms_id}" if by_id else seq_key
        if key not in table:
            order.append(key)
        table[key][rank] = c
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


def comms_id_check(results: list[RankResult]) -> str | None:
    """Where the traces carry Kineto's "Comms Id": say how many collectives the sequence-based match would pair
    differently (one Comms Id on several (group, sequence) keys across ranks, or one key on several Comms Ids).
    The match follows the Comms Id; None when the two agree or there is no Comms Id."""
    keyed = _keyed(results)
    if not _uses_comms_id(keyed):
        return None
    seq_of: dict[str, set[str]] = defaultdict(set)
    id_of: dict[str, set[str]] = defaultdict(set)
    for _, c, seq_key in keyed:
        assert c.comms_id is not None
        seq_of[c.comms_id].add(seq_key)
        id_of[seq_key].add(c.comms_id)
    bad = {cid for cid, keys in seq_of.items() if len(keys) > 1}
    bad |= {cid for keys in id_of.values() if len(keys) > 1 for cid in keys}
    if not bad:
        return None
    return (f"{len(bad)} of {len(seq_of)} collectives carry a Kineto Comms Id that the (group, sequence) matching "
            "pairs differently across ranks: matched by Comms Id (docs/metrics.md#collective-matching)")


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
            if c.launch_us is not None:
                c.launch_us -= d
        for b in r.buckets:
            b.start_us -= d
            b.end_us -= d
        for g in r.grad_ready:
            g.t_us -= d
        for sc in r.syncs:
            sc.t_us -= d
        for u in r.fsdp:  # FSDP2 units' collectives: compared across ranks for the late peer (fsdp_units.late_peer)
            u.start_us -= d
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


def kind(m: MatchedCollective) -> str:
    """all_reduce, broadcast:small, ...: the classes of collectives whose lateness is compared together."""
    return f"{m.op}:small" if m.bytes is not None and m.bytes <= SMALL_BYTES else m.op


def _wait_intervals(matched: list[MatchedCollective]) -> dict[int, list[tuple[float, float, int]]]:
    """Per waiting rank: (its start, its start + how much later the last rank arrived by its own work, that rank),
    cut at its own end. Own lateness (``_own_lateness``), not raw starts: a ring's completion order is no wait."""
    out: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for m in matched:
        late = m.lateness_us or _own_lateness(None, m.starts_us)
        last = m.last_rank
        for rk, t in m.starts_us.items():
            end = min(t + late[last] - late.get(rk, 0.0), m.ends_us.get(rk, float("inf")))
            if rk != last and end > t:
                out[rk].append((t, end, last))
    return out


def _union_by_culprit(spans: list[tuple[float, float, int]]) -> tuple[float, dict[int, float]]:
    """Length of the union of ``spans`` and each culprit's share: a moment spent waiting at several overlapping
    collectives (DDP's buckets) counts once, for the first span that covers it (sorted sweep, linear after sort)."""
    total = 0.0
    by: dict[int, float] = defaultdict(float)
    reach = float("-inf")
    for a, b, who in sorted(spans):
        lo = max(a, reach)
        if b > lo:
            total += b - lo
            by[who] += b - lo
        reach = max(reach, b)
    return total, dict(by)


def exposed_split(results: list[RankResult], matched: list[MatchedCollective]) -> list[CommSplit]:
    """Each rank's exposed communication per step split into waiting for a late peer, transfer and host dispatch
    (docs/metrics.md#exposed-split). A step's wait is the union of its collectives' waits ([own start, last rank's
    start]); compute overlaps a collective's beginning (it runs while buckets are launched), so the hidden part of
    the communication is charged to the wait first: exposed wait = clamp(wait - overlap, 0, exposed)."""
    waits = _wait_intervals(matched)
    out: list[CommSplit] = []
    for r in results:
        steps = sorted(r.metrics.per_step, key=lambda p: p.start_us)
        starts = [p.start_us for p in steps]
        by_step: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        for a, b, who in waits.get(r.metrics.rank, []):
            i = bisect.bisect_right(starts, a) - 1
            if i >= 0 and a < steps[i].start_us + steps[i].dur_us:
                by_step[i].append((a, b, who))
        calls_by_step: dict[int, list[CollectiveCall]] = defaultdict(list)
        for c in r.calls:
            i = bisect.bisect_right(starts, c.launch_us if c.launch_us is not None else c.start_us) - 1
            if i >= 0:
                calls_by_step[i].append(c)
        exposed = wait = dispatch = 0.0
        waiting_for: dict[int, float] = defaultdict(float)
        wait_by_step: dict[int, float] = {}
        for i, p in enumerate(steps):
            union, shares = _union_by_culprit(by_step.get(i, []))
            w = min(p.exposed_comm_us, max(0.0, union - p.overlap_us))
            if union > 0:
                for who, v in shares.items():
                    waiting_for[who] += w * v / union
            wait_by_step[p.step] = w
            exposed += p.exposed_comm_us
            wait += w
            dispatch += _dispatch_us(calls_by_step.get(i, []))
        # On a GPU a kernel's launch-to-start time is mostly queueing behind its stream's compute, not host
        # dispatch (real A100 traces: 110-130 ms per step of it): not reported there.
        out.append(CommSplit(rank=r.metrics.rank, steps=len(steps), exposed_us=exposed, wait_us=wait,
                             transfer_us=exposed - wait, dispatch_us=dispatch if r.metrics.device == "cpu" else None,
                             waiting_for_us={k: v for k, v in waiting_for.items() if v > 0}, wait_by_step=wait_by_step))
    return out


def _dispatch_us(calls: list[CollectiveCall]) -> float:
    """Time a step's collectives sat enqueued by the host while none of its communication ran: the union of
    [launch, start] less its overlap with the collectives' own running time."""
    queued = [(c.launch_us, c.start_us) for c in calls if c.launch_us is not None and c.start_us > c.launch_us]
    if not queued:
        return 0.0
    running = [(c.start_us, c.end_us) for c in calls]
    return max(0.0, iv.union_len_pairs(queued) - iv.intersect_len_pairs(queued, running))


def stragglers(results: list[RankResult], matched: list[MatchedCollective]) -> Stragglers:
    """Who makes the others wait. Each waiting rank's wait is counted once per moment (overlapping collectives of a
    step share it) and charged to the rank whose arrival ended it; a rank must be last in a clear majority of the
    collectives of the kind where it causes the most wait (an 8-byte flag broadcast every step, arrival by chance,
    does not dilute 11 of 11 gradient all-reduces)."""
    caused: dict[int, float] = {r.metrics.rank: 0.0 for r in results}
    last_count: dict[int, int] = {r.metrics.rank: 0 for r in results}
    kind_wait: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    kind_last: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    kind_n: dict[str, int] = defaultdict(int)
    for m in matched:
        late = m.lateness_us or _own_lateness(None, m.starts_us)  # built without match(): start order
        k = kind(m)
        kind_n[k] += 1
        kind_last[k][m.last_rank] += 1
        kind_wait[m.last_rank][k] += sum(late[m.last_rank] - v for v in late.values())
        last_count[m.last_rank] += 1
    for spans in _wait_intervals(matched).values():
        for who, v in _union_by_culprit(spans)[1].items():
            caused[who] = caused.get(who, 0.0) + v
    last_in_kind: dict[int, tuple[str, int, int]] = {}
    for rk, waits in kind_wait.items():
        k = max(waits, key=lambda x: (waits[x], x))
        last_in_kind[rk] = (k, kind_last[k][rk], kind_n[k])
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
            _, k_last, k_n = last_in_kind.get(rk, ("", 0, 0))
            # ... and last in a clear majority of the matched collectives of its kind (last now and then is noise).
            if (w >= STRAGGLER_DOMINANCE * typical and excess >= STRAGGLER_WAIT_SHARE * total_step
                    and k_n > 0 and k_last >= STRAGGLER_MAJORITY * k_n):
                flagged.append(rk)
    skews = [m.arrival_skew_us for m in matched]
    return Stragglers(
        ranks=sorted(flagged), caused_wait_us=caused, last_arrival_count=last_count,
        arrival_skew_median_us=statistics.median(skews) if skews else None,
        step_time_skew_us=step_skew, step_time_us_by_rank=medians, last_in_kind=last_in_kind,
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

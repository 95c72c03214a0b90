"""Interval arithmetic on numpy columns: union length, intersection length, clipping (the basis of every metric)."""

from __future__ import annotations

from operator import itemgetter

import numpy as np

Arr = np.ndarray
# numpy sums fewer than 8 numbers one after the other from 0.0 (its pairwise sum's base case), so plain Python gives
# the same float up to that many merged intervals.
_SEQUENTIAL_SUM = 8
_START = itemgetter(0)


def merge(start: Arr, end: Arr) -> tuple[Arr, Arr]:
    """Disjoint, sorted intervals covering exactly the union of [start, end)."""
    if len(start) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(start, kind="stable")
    s = np.asarray(start, dtype=np.float64)[order]
    e = np.maximum.accumulate(np.asarray(end, dtype=np.float64)[order])
    # A new merged interval begins where a start lies beyond every end seen so far.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    last = np.empty(len(s), dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    return s[new], e[last]


def union_len(start: Arr, end: Arr) -> float:
    s, e = merge(start, end)
    return float(np.sum(e - s)) if len(s) else 0.0


def union_len_pairs(pairs: list[tuple[float, float]]) -> float:
    """union_len for a handful of (start, end) pairs without numpy: its per-call cost was most of the work for a
    step's few collectives (x4 calls per step at 200,000 steps). The same merge (stable order by start, a running
    maximum of the ends) and the same sum, so the same float as union_len."""
    if not pairs:
        return 0.0
    lengths: list[float] = []
    group_start, reach = None, 0.0
    for s, e in sorted(pairs, key=_START):
        if group_start is None:
            group_start, reach = s, e
        elif s > reach:
            lengths.append(reach - group_start)
            group_start, reach = s, max(reach, e)
        elif e > reach:
            reach = e
    lengths.append(reach - group_start)  # type: ignore[operator]
    if len(lengths) >= _SEQUENTIAL_SUM:
        return float(np.sum(np.array(lengths, dtype=np.float64)))
    total = 0.0
    for n in lengths:
        total += n
    return total


def intersect_len_pairs(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """intersect_len for lists of (start, end) pairs (union_len_pairs' reasons), the same float."""
    return max(0.0, union_len_pairs(a) + union_len_pairs(b) - union_len_pairs(a + b))


def clipped_len(ms: Arr, me: Arr, lo: float, hi: float) -> float:
    """Length of merged (disjoint, sorted) intervals inside [lo, hi): two binary searches and a slice."""
    i0 = int(np.searchsorted(me, lo, side="right"))
    i1 = int(np.searchsorted(ms, hi, side="left"))
    if i1 <= i0:
        return 0.0
    return float(np.sum(np.minimum(me[i0:i1], hi) - np.maximum(ms[i0:i1], lo)))


def clipped_lens(ms: Arr, me: Arr, lo: Arr, hi: Arr) -> Arr:
    """clipped_len for many windows [lo[k], hi[k]) at once (one per step: numpy calls per window cost more than the
    arithmetic at 200,000 steps): covered length before t is F(t) = cumulative length of the merged intervals
    before the one holding t, plus the part of that one before t; a window holds F(hi) - F(lo)."""
    lo, hi = np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    if len(ms) == 0:
        return np.zeros(len(lo))
    cum = np.concatenate(([0.0], np.cumsum(me - ms)))

    def before(t: Arr) -> Arr:
        i = np.searchsorted(ms, t, side="right") - 1
        ic = np.maximum(i, 0)
        return np.where(i >= 0, cum[ic] + np.clip(t - ms[ic], 0.0, me[ic] - ms[ic]), 0.0)

    return np.maximum(before(hi) - before(lo), 0.0)


def clip(start: Arr, end: Arr, lo: float, hi: float) -> tuple[Arr, Arr]:
    """The parts of the intervals inside [lo, hi)."""
    s = np.maximum(start, lo)
    e = np.minimum(end, hi)
    keep = e > s
    return s[keep], e[keep]


def intersect_len(a: tuple[Arr, Arr], b: tuple[Arr, Arr]) -> float:
    """|A ∩ B| = |A| + |B| - |A ∪ B| for unions A and B."""
    ua = union_len(*a)
    ub = union_len(*b)
    uab = union_len(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    return max(0.0, ua + ub - uab)


def cat(*parts: tuple[Arr, Arr]) -> tuple[Arr, Arr]:
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

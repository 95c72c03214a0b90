"""Performance rules about balance: stragglers, step-time variance and skew across ranks, waiting for data; and the
step-time helpers every performance rule shares (docs/findings.md)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import overload

import numpy as np

from ddpdoctor.analyses.crossrank import STRAGGLER_MAJORITY, kind
from ddpdoctor.analyses.intervals import Interval, bootstrap
from ddpdoctor.analyses.results import Analysis, MatchedCollective, RankMetrics
from ddpdoctor.analyses.whatif import WhatIf
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_verdict import cost, undecided
from ddpdoctor.jsontypes import JsonObject

# A straggler: the median arrival skew of matched collectives (latest start - earliest start) above 5% of a step:
# every rank waits that long for the last one at every collective. Named only when the same rank is last in a clear
# majority (STRAGGLER_MAJORITY, two thirds) of the matched collectives, and its interval clears the threshold.
STRAGGLER_SKEW_WARN_PCT = 5.0
# ... and being last that often must be unlikely by chance (binomial tail under 5%, each rank last with 1/world).
STRAGGLER_CHANCE = 0.05
# ... and on a host with fewer cores than ranks plus their launcher, a median skew under one scheduler time slice is
# the OS's choice of which rank runs, not the job's (Linux's default minimum slice: CFS sched_min_granularity and
# EEVDF base_slice, both 0.75 ms). Seen on 2 ranks on 2 cores: one profile in ten named a rank late by 0.22 ms at
# 34 of 40 collectives, and which rank that was changed from profile to profile.
SCHED_SLICE_US = 750.0
# ... and its skew must exceed the skew of the other ranks when they arrive last (their median), measured where
# there are at least this many such collectives (background_lateness_pct).
BACKGROUND_MIN = 3
# Step time variation within a rank: coefficient of variation (stdev / mean) above 0.15 over at least 3 steps,
# i.e. steps commonly differ by more than 15%: a periodic stall (checkpoint, GC, logging, data) is likely.
STEP_CV_WARN = 0.15
STEP_CV_MIN_STEPS = 3
# ... and a warning only when the slow steps cost something: the mean step above the median by 5% of the median
# (time lost to stalls). Symmetric jitter (a shared, loaded host) varies as much but loses nothing: info.
STEP_VARIANCE_MIN_COST_PCT = 5.0
# ... and only for variation outside communication: when most (over half) of the slow steps' excess over the median
# step is exposed communication (a collective that took longer, as on a shared host or network), the variation is
# communication's, carried by exposed-comm-high's interval, and the "periodic work" advice would be wrong.
STEP_VARIANCE_MAX_COMM_SHARE = 0.5
# Across ranks: median step times differing by more than 10% of the median step.
RANK_STEP_SKEW_WARN_PCT = 10.0
# Waiting for the next batch at the start of steps: 10% of step time is a GPU idle a tenth of the time.
DATA_WAIT_WARN_PCT = 10.0


@overload
def ms(us: float) -> float: ...
@overload
def ms(us: None) -> None: ...
@overload
def ms(us: float | None) -> float | None: ...
def ms(us: float | None) -> float | None:
    """Microseconds to milliseconds for evidence (3 decimals)."""
    return None if us is None else round(us / 1000.0, 3)


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def median_step_us(r: RankMetrics) -> float | None:
    return r.step_time_us.get("median") if r.step_time_us else None


def run_step_us(a: Analysis) -> float | None:
    return median_or_none([v for r in a.ranks if (v := median_step_us(r))])


def rule_stragglers(a: Analysis, w: WhatIf | None) -> list[Finding]:
    s = a.stragglers
    if s is None or not s.ranks or s.arrival_skew_median_us is None:
        return []
    step = median_or_none([v for r in a.ranks if (v := median_step_us(r))])
    if not step:
        return []
    matched = a.matched or []
    total = len(matched) or sum(s.last_arrival_count.values())
    world = max(2, len(a.ranks))
    last_in = {rk: (s.last_arrival_count.get(rk, 0), total) for rk in s.ranks}
    if s.last_in_kind:
        # Judged within the kind of collective where the rank makes the others wait most (docs/metrics.md).
        last_in = {rk: (s.last_in_kind[rk][1], s.last_in_kind[rk][2]) for rk in s.ranks if rk in s.last_in_kind}
        kinds = {s.last_in_kind[rk][0] for rk in last_in}
        matched = [m for m in matched if kind(m) in kinds]
    majority = [rk for rk, (k, n) in last_in.items() if clear_majority(k, n, world)]
    steps = max((r.steps for r in a.ranks), default=0) or 1
    if not majority:
        # Never silence (docs/findings.md#perf-straggler-rank): the analysis named them; say why no finding does.
        _note(a, f"rank(s) {s.ranks} arrived last at collectives (the others waited "
              f"{sum(s.caused_wait_us.get(k, 0.0) for k in s.ranks) / steps / 1e3:.2f} ms per step for them) "
              "at " + ", ".join(f"{last_in[k][0]} of {last_in[k][1]}" for k in last_in) + " matched collectives: "
              f"not a clear majority (at least {STRAGGLER_MAJORITY:.0%}, and less than a {STRAGGLER_CHANCE:g} "
              f"chance for a rank last by chance on {world} ranks): no straggler is named")
        return []
    skews = [100.0 * m.arrival_skew_us / step for m in matched if m.last_rank in majority]
    iv = bootstrap(skews, statistics.median) if skews else None
    pct = 100.0 * s.arrival_skew_median_us / step
    if iv is None:  # no matched collectives kept (hand-built analyses): the median skew alone
        iv = Interval(pct, pct, pct, total)
    crowded = crowded_hosts(a, majority)
    if crowded and iv.value * step / 100.0 < SCHED_SLICE_US:
        note = (f"rank(s) {majority} arrived last at most collectives ("
                + ", ".join(f"{last_in[k][0]} of {last_in[k][1]}" for k in majority)
                + f"), by {iv.value * step / 1e5:.2f} ms (median): less than one scheduler time slice "
                f"({SCHED_SLICE_US / 1000:.2f} ms) on a host with {crowded}: which rank the OS sets aside decides "
                "that, not the job, so no straggler is named; with a core per rank and one for the launcher, a "
                "straggler this small would be measurable")
        if note not in a.notes:
            a.notes.append(note)
        return []
    noise = background_lateness_pct(matched, majority, step)
    threshold = max(STRAGGLER_SKEW_WARN_PCT, noise or 0.0)
    if not iv.above(threshold):
        if iv.undecided(threshold):
            return [undecided("straggler-rank", "arrival skew at collectives, % of step", iv, threshold, a)]
        _note(a, f"rank(s) {majority} arrived last at most collectives, by {iv.value:.1f}% of a step (median), "
              f"under the straggler threshold of {threshold:.1f}% (the larger of {STRAGGLER_SKEW_WARN_PCT:g}% and "
              "the other ranks' own lateness): no straggler is named")
        return []
    # The others' wait at collectives for these ranks, each moment once (crossrank.stragglers). Its exposed part
    # (docs/metrics.md#exposed-split) is shown beside it: a lower bound, as an enclosing CPU op the wait happens
    # in (Lightning's training step on gloo) counts as compute that "hides" it.
    waited = sum(v for k, v in s.caused_wait_us.items() if k in majority) / steps
    exposed_wait = {k: sum(c.waiting_for_us.get(k, 0.0) for c in a.comm_split) / steps for k in majority}
    # The host's background skew, measured in the same run (how late the other ranks are when it is their turn):
    # any rank last at these collectives would have cost that much; the straggler's cost is what it adds beyond.
    background = background_wait_us(matched, majority, steps)
    c = cost(max(0.0, waited - background) / max(1, len(a.ranks) - 1), step)
    return [Finding(
        "straggler-rank", Severity.WARNING,
        f"Rank(s) {majority} arrive last at collectives, by {iv.value:.0f}% of a step; the others wait "
        f"{c['cost_ms_per_step']} ms per step for them"
        + (f" beyond the host's background skew ({ms(background / max(1, len(a.ranks) - 1))} ms per step)"
           if background > 0 else ""),
        ranks=majority,
        evidence={**c, "skew_pct_of_step": iv.to_json(), "background_skew_pct_of_step": noise,
                  "background_wait_removed_ms_per_step": ms(background / max(1, len(a.ranks) - 1)),
                  "arrival_skew_median_ms": ms(s.arrival_skew_median_us),
                  "last_in": {str(k): f"{last_in[k][0]} of {last_in[k][1]}" for k in majority},
                  "collective_kind": {str(k): s.last_in_kind[k][0] for k in majority if k in s.last_in_kind},
                  "others_waited_ms": {str(k): ms(v) for k, v in s.caused_wait_us.items() if k in majority},
                  "others_exposed_wait_ms_per_step": {str(k): ms(v / max(1, len(a.ranks) - 1))
                                                      for k, v in exposed_wait.items()} if a.comm_split else None,
                  "others_waited_ms_per_step": {str(k): ms(v / steps) for k, v in s.caused_wait_us.items()
                                                if k in majority},
                  "step_time_ms_by_rank": {str(k): ms(v) for k, v in s.step_time_us_by_rank.items()}},
        advice="Find what the slow rank does differently: its host (`ddpdoctor topo`), its data shard (uneven "
        "batches, slow storage), CPU contention (pin threads, set OMP_NUM_THREADS), thermal throttling.",
    )]


def _note(a: Analysis, note: str) -> None:
    if note not in a.notes:
        a.notes.append(note)


def background_lateness_pct(matched: Sequence[MatchedCollective], candidates: list[int],
                            step_us: float) -> float | None:
    """The noise a straggler must rise above: how late the other ranks are, as % of a step (median), at the
    collectives where one of them arrives last. A rank that is last more often than the others, but by no more than
    they are when it is their turn, is what a shared host's scheduling does to any rank (seen on 2-rank gloo: the
    same healthy job named rank 0 in one profile of six). None with fewer than BACKGROUND_MIN such collectives (a
    rank last almost everywhere: nothing to compare with, the threshold alone decides)."""
    others = [m.arrival_skew_us for m in matched if m.last_rank not in candidates]
    if len(others) < BACKGROUND_MIN or step_us <= 0:
        return None
    return round(100.0 * statistics.median(others) / step_us, 1)


def background_wait_us(matched: Sequence[MatchedCollective], candidates: list[int], steps: int) -> float:
    """The wait per step that background skew alone would cause at the collectives where ``candidates`` arrive last:
    the other ranks' median lateness when they are last (background_lateness_pct's figure, in us) times the number
    of such collectives per step; 0 when too few collectives see another rank last to measure it."""
    others = [m.arrival_skew_us for m in matched if m.last_rank not in candidates]
    if len(others) < BACKGROUND_MIN or steps <= 0:
        return 0.0
    theirs = sum(1 for m in matched if m.last_rank in candidates)
    return statistics.median(others) * theirs / steps


def crowded_hosts(a: Analysis, ranks: list[int]) -> str | None:
    """'N ranks on M cores' when every one of ``ranks`` ran on a host with fewer usable cores than its ranks plus
    their launcher (a ddpdoctor run records both); None otherwise or when unknown (traces recorded elsewhere)."""
    if not ranks or any(r not in a.host_cpus for r in ranks):
        return None
    seen = sorted({a.host_cpus[r] for r in ranks})
    if any(cpus >= local + 1 for cpus, local in seen):
        return None
    return " / ".join(f"{local} ranks on {cpus} cores" for cpus, local in seen)


def clear_majority(k: int, n: int, world: int) -> bool:
    """Last in k of n matched collectives is a clear majority: at least STRAGGLER_MAJORITY of them, and unlikely
    (< STRAGGLER_CHANCE) for a rank that is last by chance (probability 1/world each time): 4 of 5 is not enough."""
    if n <= 0 or k < STRAGGLER_MAJORITY * n:
        return False
    return binomial_tail(k, n, 1.0 / world) < STRAGGLER_CHANCE


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), 0 < p < 1, in log space: exact integers (math.comb) grow with n and
    overflow a float at thousands of collectives (a long window or many steps)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    lp, lq, lfn = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    terms = [lfn - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq for i in range(k, n + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * math.fsum(math.exp(t - top) for t in terms))


def _cv(values: Sequence[float]) -> float:
    if isinstance(values, np.ndarray):  # many steps: bootstrap resamples in numpy (analyses/intervals.py)
        m = float(values.mean())
        return float(values.std()) / m if m > 0 else 0.0
    # In floats (fsum), not statistics.pstdev's exact fractions: it is called 400 times per rank by the bootstrap,
    # and its rational arithmetic was most of analyze's time at 1,024 ranks.
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)) / mean if mean > 0 else 0.0


def excess_in_comm_share(r: RankMetrics) -> float:
    """Of the time by which this rank's slower-than-median steps exceed the median step, the share that is exposed
    communication beyond the median step's (0 when no step exceeds the median)."""
    steps = r.per_step
    med = statistics.median(s.dur_us for s in steps)
    med_comm = statistics.median(s.exposed_comm_us for s in steps)
    slow = [s for s in steps if s.dur_us > med]
    excess = sum(s.dur_us - med for s in slow)
    in_comm = sum(max(0.0, s.exposed_comm_us - med_comm) for s in slow)
    return min(1.0, in_comm / excess) if excess > 0 else 0.0


def rule_step_variance(a: Analysis, w: WhatIf | None) -> list[Finding]:
    out: list[Finding] = []
    noisy: dict[int, JsonObject] = {}  # rank -> its evidence
    undecided_iv: Interval | None = None
    costs: list[float] = []
    for r in a.ranks:
        durs = [s.dur_us for s in r.per_step]
        durs = durs[warmup_prefix(durs):]
        if len(durs) < STEP_CV_MIN_STEPS or statistics.fmean(durs) <= 0:
            continue
        if excess_in_comm_share(r) > STEP_VARIANCE_MAX_COMM_SHARE:
            continue  # the slow steps are slow in communication: exposed-comm-high's business
        if _cv(durs) <= STEP_CV_WARN:
            continue  # its interval can neither clear the threshold nor be undecided over it: no resampling
        iv = bootstrap(durs, _cv)
        if iv is None:
            continue
        if iv.above(STEP_CV_WARN):
            slow = max(r.per_step, key=lambda s: s.dur_us)
            costs.append(_slow_steps_excess_us(durs))
            noisy[r.rank] = {"cv": iv.to_json(digits=3), "slowest_step": slow.step, "slowest_ms": ms(slow.dur_us),
                             "median_ms": ms(statistics.median(durs))}
        elif (iv.undecided(STEP_CV_WARN) and (undecided_iv is None or iv.value > undecided_iv.value)
              and (med := statistics.median(durs)) > 0
              and 100.0 * _slow_steps_excess_us(durs) / med >= STEP_VARIANCE_MIN_COST_PCT):
            undecided_iv = iv  # a cv that, decided, would still cost too little is not worth more steps
    if noisy:  # said only when the slow steps cost something (below: symmetric jitter, nothing to fix)
        step_us = median_or_none([v for r in a.ranks if (v := median_step_us(r))])
        lost = max(0.0, max(costs))
        worth = bool(step_us) and 100.0 * lost / (step_us or 1.0) >= STEP_VARIANCE_MIN_COST_PCT
        if worth:
            out.append(Finding(
                "step-time-variance", Severity.WARNING,
                f"Step times vary by more than {100 * STEP_CV_WARN:.0f}% between steps",
                ranks=sorted(noisy), evidence={**cost(lost, step_us), "min_cost_pct": STEP_VARIANCE_MIN_COST_PCT,
                    "by_rank": {str(k): v for k, v in sorted(noisy.items())}, "threshold_cv": STEP_CV_WARN},
                advice="Look at the slowest step in the timeline: periodic work (checkpointing, logging, "
                "`gc.collect`, evaluation) or a data stall; move it off the training path or make it asynchronous.",
            ))
    elif undecided_iv is not None:
        out.append(undecided("step-time-variance", "step-time coefficient of variation", undecided_iv, STEP_CV_WARN,
                             a, unit="cv"))
    out.extend(_rank_skew(a))
    return out


def _slow_steps_excess_us(durs: Sequence[float]) -> float:
    """What the slow steps cost per step: the mean step minus the median step."""
    return statistics.fmean(durs) - statistics.median(durs)


def warmup_prefix(durs: Sequence[float]) -> int:
    """How many leading recorded steps are still warm-up: the longest prefix (at most a third of the window) whose
    fastest step is slower than (1 + STEP_CV_WARN) x the upper quartile of the steps after it, i.e. unlike what
    follows. A job is slow in its first iterations (caches, allocator, thread pools; on a GPU autotuning), and
    the default window starts 3 iterations in: on a healthy 2-rank gloo job the first 1-2 recorded steps took twice
    the median in most profiles, a variance that came and went with where the window started, with nothing
    periodic to fix. Steps that alternate slow and fast are not a prefix: the slow ones recur after it.

    Every prefix length is tried in one pass: the steps after the prefix are counts in a Fenwick tree over the
    steps' sorted order, a step leaves it as the prefix grows, and the upper quartile (statistics.quantiles, method
    "inclusive", the same arithmetic) is two order-statistic lookups: O(n log n), where sorting the rest for every
    prefix length took 49 s at 40,000 steps and never finished at 200,000."""
    n = len(durs)
    longest = n // 3
    if longest < 1 or n - longest < 2:
        return 0
    order = sorted(range(n), key=durs.__getitem__)
    pos = [0] * n
    for p, i in enumerate(order):
        pos[i] = p
    ordered = [float(durs[i]) for i in order]
    tree = [0] + [i & -i for i in range(1, n + 1)]  # every step counted once: node i covers (i - lowbit(i), i]
    top = 1 << (n.bit_length() - 1)

    def kth(j: int) -> float:
        """The j-th smallest (0-based) of the steps still counted."""
        at, left, step = 0, j + 1, top
        while step:
            nxt = at + step
            if nxt <= n and tree[nxt] < left:
                at, left = nxt, left - tree[nxt]
            step >>= 1
        return ordered[at]

    best, fastest = 0, float("inf")
    for k in range(1, longest + 1):
        fastest = min(fastest, float(durs[k - 1]))
        i = pos[k - 1] + 1
        while i <= n:  # step k-1 joins the prefix: no longer counted among the rest
            tree[i] -= 1
            i += i & -i
        m = n - k - 1
        j, delta = divmod(3 * m, 4)
        q3 = (kth(j) * (4 - delta) + kth(j + 1) * delta) / 4
        if fastest > (1.0 + STEP_CV_WARN) * q3:
            best = k
    return best


def _rank_skew(a: Analysis) -> list[Finding]:
    """Ranks whose step times differ by more than RANK_STEP_SKEW_WARN_PCT, over the steps every rank recorded: the
    slowest and fastest rank's durations are paired step by step and the mean of their differences must clear the
    threshold across its interval. Ranks that synchronise every step share the time between the same step
    boundaries, so per-step noise cancels in the pairs; comparing each rank's median instead reports noise."""
    per_rank = {r.rank: {s.step: s.dur_us for s in r.per_step} for r in a.ranks if r.per_step}
    if len(per_rank) < 2:
        return []
    common = sorted(set.intersection(*(set(d) for d in per_rank.values())))
    if len(common) < STEP_CV_MIN_STEPS:
        return []  # the ranks recorded different steps: nothing to pair
    means = {k: statistics.fmean(d[s] for s in common) for k, d in per_rank.items()}
    slow, fast = max(means, key=lambda k: means[k]), min(means, key=lambda k: means[k])
    mid = statistics.median(means.values())
    diff = bootstrap([per_rank[slow][s] - per_rank[fast][s] for s in common])
    if mid <= 0 or diff is None:
        return []
    iv = Interval(100.0 * diff.value / mid, 100.0 * diff.lo / mid, 100.0 * diff.hi / mid, diff.n)
    if iv.value <= RANK_STEP_SKEW_WARN_PCT:
        return []
    if not iv.above(RANK_STEP_SKEW_WARN_PCT):
        return [undecided("step-time-rank-skew", "step-time difference across ranks, % of step", iv,
                          RANK_STEP_SKEW_WARN_PCT, a)]
    return [Finding(
        "step-time-rank-skew", Severity.WARNING,
        f"Step time differs by {iv.value:.0f}% across ranks (slowest: rank {slow})",
        ranks=[slow], evidence={**cost(diff.value, mid),
                                "step_time_ms_by_rank": {str(k): ms(v) for k, v in sorted(means.items())},
                                "difference_pct_of_step": iv.to_json(), "steps_compared": len(common),
                                "spread_ms": ms(diff.value), "threshold_pct": RANK_STEP_SKEW_WARN_PCT},
        advice="Ranks of a DDP job should step together; compare the slow rank's host, data and "
        "profiler window (all ranks must record the same steps).",
    )]


def rule_data_wait(a: Analysis, w: WhatIf | None) -> list[Finding]:
    iv = bootstrap([100.0 * s.data_wait_us / s.dur_us for r in a.ranks for s in r.per_step if s.dur_us > 0])
    if iv is None:
        return []
    if not iv.above(DATA_WAIT_WARN_PCT):
        return [undecided("data-loading-wait", "waiting for data, % of step", iv, DATA_WAIT_WARN_PCT, a)] \
            if iv.undecided(DATA_WAIT_WARN_PCT) else []
    hot: dict[int, float] = {}
    per_step_ms: dict[str, float | None] = {}
    for r in a.ranks:
        total = sum(s.dur_us for s in r.per_step)
        if total <= 0:
            continue
        pct = 100.0 * r.data_wait_us / total
        if pct > DATA_WAIT_WARN_PCT:
            hot[r.rank] = pct
            per_step_ms[str(r.rank)] = ms(r.data_wait_us / max(1, len(r.per_step)))
    if not hot:
        return []
    wait_us = statistics.median(s.data_wait_us for r in a.ranks for s in r.per_step)
    return [Finding(
        "data-loading-wait", Severity.WARNING,
        f"Steps wait for the next batch {iv.value:.0f}% of the time",
        ranks=sorted(hot),
        evidence={**cost(wait_us, median_or_none([v for r in a.ranks if (v := median_step_us(r))])),
                  "data_wait_pct_of_step": iv.to_json(),
                  "data_wait_pct": {str(k): round(v, 1) for k, v in sorted(hot.items())},
                  "data_wait_ms_per_step": per_step_ms, "threshold_pct": DATA_WAIT_WARN_PCT},
        advice="`DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)`; "
        "move decoding/augmentation off the main process.",
    )]

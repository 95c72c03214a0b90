"""Performance rules about DDP's flags and about balance: flags that cost time, stragglers, step-time variance,
waiting for data (docs/findings.md)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, overload

from ddpdoctor.analyses.model import Analysis, RankMetrics
from ddpdoctor.analyses.whatif import MIB, WhatIf, ddp_config
from ddpdoctor.findings.model import Finding, Severity

# gradient_as_bucket_view saves one gradient-sized copy per step and that much memory; below 25 MiB (one default
# bucket) the saving is under a millisecond on any GPU and not worth a finding.
GRAD_VIEW_MIN_BYTES = 25 * MIB
# A straggler: the median arrival skew of matched collectives (latest start - earliest start) above 5% of a step:
# every rank waits that long for the last one at every collective.
STRAGGLER_SKEW_WARN_PCT = 5.0
STRAGGLER_SKEW_ERROR_PCT = 25.0
# Step time variation within a rank: coefficient of variation (stdev / mean) above 0.15 over at least 3 steps,
# i.e. steps commonly differ by more than 15%: a periodic stall (checkpoint, GC, logging, data) is likely.
STEP_CV_WARN = 0.15
STEP_CV_MIN_STEPS = 3
# Across ranks: median step times differing by more than 10% of the median step.
RANK_STEP_SKEW_WARN_PCT = 10.0
# Waiting for the next batch at the start of steps: 10% of step time is a GPU idle a tenth of the time.
DATA_WAIT_WARN_PCT = 10.0
DATA_WAIT_ERROR_PCT = 30.0


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


def rule_ddp_flags(a: Analysis, w: WhatIf | None) -> list[Finding]:
    cfg = ddp_config(a)
    if not cfg:
        return []
    out: list[Finding] = []
    n_params = cfg.get("parameter_tensors") or len(cfg.get("parameters") or [])
    per_step: dict[tuple[int, int], int] = defaultdict(int)
    for g in a.grad_ready:
        if g.step is not None:
            per_step[(g.rank, g.step)] += 1
    counts = sorted(set(per_step.values()))
    ranks = sorted({r.rank for r in a.ranks})
    steps = sorted({s for _, s in per_step})
    if cfg.get("find_unused_parameters"):
        if counts and n_params and min(counts) >= n_params:
            out.append(Finding(
                "find-unused-parameters-unneeded", Severity.WARNING,
                "find_unused_parameters=True, but every parameter received a gradient in every step",
                ranks=ranks, evidence={"parameter_tensors": n_params, "gradients_per_step": counts, "steps": steps},
                advice="`DDP(model, find_unused_parameters=False)`: it skips a traversal of the autograd graph "
                "every step and lets gradient all_reduces start during backward.",
            ))
        elif counts and len(counts) == 1 and not cfg.get("static_graph"):
            out.append(Finding(
                "static-graph-would-help", Severity.INFO,
                f"The same {counts[0]} of {n_params} parameters get gradients every step: the graph looks static",
                ranks=ranks,
                evidence={"parameter_tensors": n_params, "gradients_per_step": counts[0], "steps": steps},
                advice="`DDP(model, static_graph=True)` (keeping find_unused_parameters) lets DDP skip the "
                "per-step search for unused parameters after the first iteration.",
            ))
        elif not counts:
            out.append(Finding(
                "find-unused-parameters-on", Severity.INFO,
                "find_unused_parameters=True costs a graph traversal every step",
                ranks=ranks, evidence={"parameter_tensors": n_params, "gradients_per_step": None},
                advice="If every parameter gets a gradient, use `DDP(model, find_unused_parameters=False)`; if the "
                "unused set never changes, `static_graph=True`.",
            ))
    nbytes = int(cfg.get("parameter_bytes") or 0)
    if cfg.get("gradient_as_bucket_view") is False and nbytes >= GRAD_VIEW_MIN_BYTES:
        out.append(Finding(
            "gradient-as-bucket-view-off", Severity.INFO,
            f"Gradients are copied out of DDP's buckets every step ({nbytes / MIB:.0f} MiB)",
            ranks=ranks, evidence={"parameter_bytes": nbytes, "threshold_bytes": GRAD_VIEW_MIN_BYTES},
            advice="`DDP(model, gradient_as_bucket_view=True)` makes .grad views into the buckets: one copy and "
            f"{nbytes / MIB:.0f} MiB of memory less (do not detach_() or replace .grad in your code).",
        ))
    return out


def rule_stragglers(a: Analysis, w: WhatIf | None) -> list[Finding]:
    s = a.stragglers
    if s is None or not s.ranks or s.arrival_skew_median_us is None:
        return []
    step = median_or_none([v for r in a.ranks if (v := median_step_us(r))])
    if not step:
        return []
    pct = 100.0 * s.arrival_skew_median_us / step
    if pct <= STRAGGLER_SKEW_WARN_PCT:
        return []
    steps = max((r.steps for r in a.ranks), default=0) or 1
    return [Finding(
        "straggler-rank", Severity.ERROR if pct > STRAGGLER_SKEW_ERROR_PCT else Severity.WARNING,
        f"Rank(s) {s.ranks} arrive last at collectives; the others wait {pct:.0f}% of a step",
        ranks=list(s.ranks),
        evidence={"arrival_skew_median_ms": ms(s.arrival_skew_median_us), "skew_pct_of_step": round(pct, 1),
                  "others_waited_ms": {str(k): ms(v) for k, v in s.caused_wait_us.items() if k in s.ranks},
                  "others_waited_ms_per_step": {str(k): ms(v / steps) for k, v in s.caused_wait_us.items()
                                                if k in s.ranks},
                  "last_arrival_count": {str(k): v for k, v in s.last_arrival_count.items()},
                  "step_time_ms_by_rank": {str(k): ms(v) for k, v in s.step_time_us_by_rank.items()}},
        advice="Find what the slow rank does differently: its host (`ddpdoctor topo`), its data shard (uneven "
        "batches, slow storage), CPU contention (pin threads, set OMP_NUM_THREADS), thermal throttling.",
    )]


def rule_step_variance(a: Analysis, w: WhatIf | None) -> list[Finding]:
    out: list[Finding] = []
    noisy: dict[int, dict[str, Any]] = {}
    for r in a.ranks:
        durs = [s.dur_us for s in r.per_step]
        if len(durs) < STEP_CV_MIN_STEPS or statistics.fmean(durs) <= 0:
            continue
        cv = statistics.pstdev(durs) / statistics.fmean(durs)
        if cv > STEP_CV_WARN:
            slow = max(r.per_step, key=lambda s: s.dur_us)
            noisy[r.rank] = {"cv": round(cv, 3), "slowest_step": slow.step, "slowest_ms": ms(slow.dur_us),
                             "median_ms": ms(statistics.median(durs))}
    if noisy:
        out.append(Finding(
            "step-time-variance", Severity.WARNING,
            f"Step times vary by more than {100 * STEP_CV_WARN:.0f}% between steps",
            ranks=sorted(noisy), evidence={"by_rank": {str(k): v for k, v in sorted(noisy.items())},
                                           "threshold_cv": STEP_CV_WARN},
            advice="Look at the slowest step in the timeline: periodic work (checkpointing, logging, "
            "`gc.collect`, evaluation) or a data stall; move it off the training path or make it asynchronous.",
        ))
    meds = {r.rank: v for r in a.ranks if (v := median_step_us(r))}
    if len(meds) >= 2:
        mid = statistics.median(meds.values())
        spread = max(meds.values()) - min(meds.values())
        if mid > 0 and 100.0 * spread / mid > RANK_STEP_SKEW_WARN_PCT:
            slow_rank = max(meds, key=lambda k: meds[k])
            out.append(Finding(
                "step-time-rank-skew", Severity.WARNING,
                f"Median step time differs by {100 * spread / mid:.0f}% across ranks (slowest: rank {slow_rank})",
                ranks=[slow_rank], evidence={"step_time_ms_by_rank": {str(k): ms(v) for k, v in sorted(meds.items())},
                                        "spread_ms": ms(spread), "threshold_pct": RANK_STEP_SKEW_WARN_PCT},
                advice="Ranks of a DDP job should step together; compare the slow rank's host, data and "
                "profiler window (all ranks must record the same steps).",
            ))
    return out


def rule_data_wait(a: Analysis, w: WhatIf | None) -> list[Finding]:
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
    worst = max(hot.values())
    return [Finding(
        "data-loading-wait", Severity.ERROR if worst > DATA_WAIT_ERROR_PCT else Severity.WARNING,
        f"Steps wait for the next batch {worst:.0f}% of the time",
        ranks=sorted(hot),
        evidence={"data_wait_pct": {str(k): round(v, 1) for k, v in sorted(hot.items())},
                  "data_wait_ms_per_step": per_step_ms,
                  "threshold_pct": {"warning": DATA_WAIT_WARN_PCT, "error": DATA_WAIT_ERROR_PCT}},
        advice="`DataLoader(..., num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)`; "
        "move decoding/augmentation off the main process.",
    )]

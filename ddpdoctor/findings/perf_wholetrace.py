"""Traces without ProfilerStep (the profiler used without a schedule, serving and RL frameworks): the figures that
hold over the whole trace, said in one finding, while every per-step rule stays quiet (docs/findings.md,
"no-profiler-steps")."""

from __future__ import annotations

import statistics
from typing import Any

from ddpdoctor.analyses.results import Analysis
from ddpdoctor.analyses.whatif import WhatIf
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.findings.perf_balance import clear_majority, ms
from ddpdoctor.jsontypes import JsonObject

NO_STEPS_ID = "no-profiler-steps"
# Said with the finding: how to record steps.
NO_STEPS_ADVICE = ("Per-step figures (step time, exposed communication per step, buckets, stragglers' cost per step, "
                   "step-time variance) need one ProfilerStep#N per training step: record with `ddpdoctor profile`, or "
                   "call `prof.step()` once per training step inside `torch.profiler.profile(schedule=...)`.")


def _spread(values: list[float]) -> dict[str, float | None]:
    """min / median / max of a per-rank figure (a few numbers, whatever the number of ranks)."""
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3), "max": round(max(values), 3)}


def last_arrivals(a: Analysis) -> JsonObject:
    """Who arrives last at the matched collectives: the rank last most often, how often, whether that is a clear
    majority (not chance: findings/perf_balance.clear_majority) and its median lateness there."""
    matched = a.matched or []
    if not matched:
        return {"matched_collectives": 0}
    counts: dict[int, int] = {}
    for m in matched:
        counts[m.last_rank] = counts.get(m.last_rank, 0) + 1
    rank = max(counts, key=lambda k: (counts[k], -k))
    late = [m.arrival_skew_us for m in matched if m.last_rank == rank]
    world = max(2, len(a.ranks))
    return {"matched_collectives": len(matched), "last_rank": rank, "last_in": counts[rank],
            "clear_majority": clear_majority(counts[rank], len(matched), world),
            "late_ms_median": ms(statistics.median(late))}


def rule_no_steps(a: Analysis, w: WhatIf | None) -> list[Finding]:
    """One info finding when no rank recorded a step: the whole-trace overlap, exposed communication and arrival
    order, and what per-step figures would need."""
    if not a.ranks or any(r.steps for r in a.ranks):
        return []
    comm = [r for r in a.ranks if r.comm_us > 0]
    total_comm = sum(r.comm_us for r in comm)
    total_ov = sum(r.overlap_us for r in comm)
    arrivals = last_arrivals(a)
    evidence: dict[str, Any] = {  # an evidence map (Finding.evidence): shown and copied as it is
        "ranks": len(a.ranks),
        "overlap_pct": None if total_comm <= 0 else round(100.0 * total_ov / total_comm, 1),
        "comm_ms_by_rank": _spread([r.comm_us / 1000.0 for r in comm]),
        "exposed_comm_ms_by_rank": _spread([r.exposed_comm_us / 1000.0 for r in comm]),
        "compute_ms_by_rank": _spread([r.compute_us / 1000.0 for r in a.ranks]),
        "collectives": len(a.calls),
        **arrivals,
    }
    title = "No ProfilerStep in the trace" + ("s" if len(a.ranks) > 1 else "") + ": figures over the whole trace"
    if evidence["overlap_pct"] is not None:
        title += f"; {evidence['overlap_pct']:g}% of communication overlapped compute"
    if arrivals.get("clear_majority"):
        title += (f"; rank {arrivals['last_rank']} arrived last at {arrivals['last_in']} of "
                  f"{arrivals['matched_collectives']} matched collectives ({arrivals['late_ms_median']} ms late, "
                  "median)")
    return [Finding(NO_STEPS_ID, Severity.INFO, title, ranks=sorted(r.rank for r in a.ranks), evidence=evidence,
                    advice=NO_STEPS_ADVICE)]

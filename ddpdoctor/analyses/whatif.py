"""Bucket what-if: from an Analysis, replay DDP's gradient bucketing and the all_reduce queue (bucket_replay.py: as
many concurrent lanes as the run showed, one NCCL stream, gloo's worker threads) to predict exposed communication per
``bucket_cap_mb`` (docs/whatif.md)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ddpdoctor.analyses.bucket_replay import (
    DEFAULT_BUCKET_CAP_MB,
    MIB,
    Grad,
    StepBatch,
    StepOutcomes,
    bucket_limits,
    observed_lanes,
)
from ddpdoctor.analyses.results import Analysis, Bucket, StepMetrics
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DDPModule

# The caps the issue asks about; DDP's own default (25) is among them.
CANDIDATE_CAPS_MB: tuple[float, ...] = (1, 5, 10, 25, 50, 100, 200)
# Two predictions closer than this share of a step are a tie: the model is not that precise, and between tied caps
# the current one (no change) or else the larger one (fewer collectives, less per-call overhead) is recommended.
TIE_SHARE_OF_STEP = 0.01


@dataclass
class CapPrediction:
    bucket_cap_mb: float
    buckets_per_step: float  # median over simulated steps
    exposed_comm_us: float  # median over simulated (rank, step) pairs
    comm_us: float  # median total all_reduce time per step
    first_start_after_backward_start_us: float | None  # median; how late in backward communication begins


@dataclass
class WhatIf:
    """The prediction for each candidate cap, the recommendation, and how well the model fits this run."""

    available: bool
    reason: str | None = None
    latency_us: float | None = None
    bytes_per_us: float | None = None
    bandwidth_source: str | None = None  # "matched" | "fit" | "buckets"
    grad_source: str | None = None  # "trace" | "trace+bucket_sizes" | "interpolated"
    samples: int = 0  # (rank, step) pairs simulated
    step_time_us: float | None = None  # median measured step time
    current_bucket_cap_mb: float | None = None
    current_predicted_exposed_us: float | None = None
    current_buckets_per_step: float | None = None  # the replayed current layout (median)
    measured_buckets_per_step: float | None = None  # the buckets DDP actually ran (median)
    measured_exposed_us: float | None = None  # median measured exposed communication per step
    fit_error_pct_of_step: float | None = None  # |current predicted - measured| as % of the median step
    predictions: list[CapPrediction] = field(default_factory=list)
    best_bucket_cap_mb: float | None = None
    best_predicted_exposed_us: float | None = None
    saving_us_per_step: float | None = None  # current predicted - best predicted (>= 0)
    saving_pct_of_step: float | None = None
    lanes: int = 1  # all_reduces the backend ran at once in this run (measured; the queue simulated has as many)

    def to_json(self) -> JsonObject:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- from an Analysis

def ddp_config(analysis: Analysis) -> DDPModule | None:
    """The first DDP module's configuration and bucket layout (the run directory's manifest), None for bare traces."""
    return analysis.ddp[0].config if analysis.ddp else None


def fit_transfer(points: Sequence[tuple[int, float]]) -> tuple[float, float] | None:
    """(latency_us, bytes_per_us) by least squares of dur = latency + bytes / bytes_per_us; through the origin
    (latency 0) when the sizes do not vary or the fitted line is not physical (negative latency or slope)."""
    pts = [(float(b), float(t)) for b, t in points if b > 0 and t > 0]
    if not pts:
        return None
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    sxx = sum((b - mb) ** 2 for b, _ in pts)
    if n >= 2 and sxx > 0:
        slope = sum((b - mb) * (t - mt) for b, t in pts) / sxx
        latency = mt - slope * mb
        if slope > 0 and latency >= 0:
            return latency, 1.0 / slope
    return 0.0, sum(b for b, _ in pts) / sum(t for _, t in pts)


def _bandwidth(analysis: Analysis) -> tuple[float, float, str] | None:
    """(latency_us, bytes_per_us, source). First choice: the all_reduces matched across ranks, timed from the last
    rank's arrival to the end (median over ranks), so waiting for a straggler is not mistaken for transfer time
    (the bucket layout does not change who arrives late). Then the analysis's own fit over call durations, then
    the aggregate rate of the buckets."""
    matched = [m for m in analysis.matched if m.bytes and len(m.starts_us) >= 2 and m.ends_us]
    reduces = [m for m in matched if m.op == "all_reduce"] or matched
    points = [(int(m.bytes or 0), statistics.median(m.ends_us.values()) - max(m.starts_us.values()))
              for m in reduces]
    fitted = fit_transfer(points)
    if fitted is not None:
        return fitted[0], fitted[1], "matched"
    fit = analysis.bandwidth
    if fit.bytes_per_us is not None and fit.bytes_per_us > 0:
        return max(0.0, fit.latency_us or 0.0), fit.bytes_per_us, "fit"
    fitted = fit_transfer([(b.bytes or 0, b.dur_us) for b in analysis.buckets])
    if fitted is not None:
        return fitted[0], fitted[1], "buckets"
    return None


def _device_clock(t: float, st: StepMetrics | None) -> float:
    """A CPU time inside backward mapped onto the device's backward span. On GPU traces, AccumulateGrad ends on the
    CPU ahead of its kernels, while buckets and backward_*_us are device times: scale [CPU backward start, end]
    onto [device backward start, end] (order and proportions kept). CPU traces have one clock: unchanged."""
    if st is None:
        return t
    cs, ce = getattr(st, "cpu_backward_start_us", None), getattr(st, "cpu_backward_end_us", None)
    ds, de = st.backward_start_us, st.backward_end_us
    if cs is None or ce is None or ds is None or de is None or ce <= cs or (cs == ds and ce == de):
        return t
    return ds + (t - cs) * (de - ds) / (ce - cs)


def _sizes_from_buckets(times: list[float], buckets: list[Bucket]) -> list[int] | None:
    """Gradient sizes when the trace recorded no shapes: each gradient belongs to the first bucket that starts at
    or after it is ready (the last bucket takes the rest), and shares that bucket's bytes evenly with its
    bucket-mates. None when a bucket would get no gradient (the times do not explain the layout)."""
    ordered = sorted(buckets, key=lambda b: b.index)
    if not ordered or any(not b.bytes for b in ordered):
        return None
    owner: list[int] = []
    for t in times:
        k = next((i for i, b in enumerate(ordered) if b.start_us >= t), len(ordered) - 1)
        owner.append(max(k, owner[-1] if owner else 0))  # buckets are filled in ready order
    counts = [owner.count(i) for i in range(len(ordered))]
    if 0 in counts:
        return None
    return [int((ordered[k].bytes or 0) / counts[k]) for k in owner]


def _steps_from_trace(analysis: Analysis, param_bytes_in_ready_order: list[int]
                      ) -> tuple[dict[tuple[int, int], list[Grad]], bool]:
    """Gradients per (rank, step) from the recorded AccumulateGrad ends, and whether some sizes had to be taken
    from the measured buckets. A missing size comes from the manifest when the step saw exactly the manifest's
    parameters, else from the step's measured buckets (_sizes_from_buckets)."""
    per_step = {(r.rank, s.step): s for r in analysis.ranks for s in r.per_step}
    buckets: dict[tuple[int, int], list[Bucket]] = defaultdict(list)
    for b in analysis.buckets:
        buckets[(b.rank, b.step)].append(b)
    raw: dict[tuple[int, int], list[tuple[float, int | None]]] = defaultdict(list)
    for g in analysis.grad_ready:
        if g.step is not None:
            raw[(g.rank, g.step)].append((_device_clock(g.t_us, per_step.get((g.rank, g.step))), g.bytes))
    out: dict[tuple[int, int], list[Grad]] = {}
    from_buckets = False
    for key, items in raw.items():
        items.sort(key=lambda x: x[0])
        if any(b is None for _, b in items):
            if len(items) == len(param_bytes_in_ready_order):
                items = [(t, b if b is not None else param_bytes_in_ready_order[i]) for i, (t, b) in enumerate(items)]
            else:
                sizes = _sizes_from_buckets([t for t, _ in items], buckets.get(key, []))
                if sizes is None:
                    continue
                items = [(t, n) for (t, _), n in zip(items, sizes, strict=True)]
                from_buckets = True
        out[key] = [Grad(t, int(b or 0)) for t, b in items]
    return out, from_buckets


def _steps_interpolated(analysis: Analysis, param_bytes_in_ready_order: list[int]) -> dict[tuple[int, int], list[Grad]]:
    """Without recorded gradient times: spread the manifest's parameters (in DDP's ready order) over each step's
    backward window in proportion to their bytes (a constant gradient byte rate: a coarse, documented fallback)."""
    out: dict[tuple[int, int], list[Grad]] = {}
    total = sum(param_bytes_in_ready_order)
    if not total:
        return out
    for r in analysis.ranks:
        for s in r.per_step:
            if s.backward_start_us is None or s.backward_end_us is None or s.backward_end_us <= s.backward_start_us:
                continue
            span = s.backward_end_us - s.backward_start_us
            acc = 0
            grads = []
            for b in param_bytes_in_ready_order:
                acc += b
                grads.append(Grad(s.backward_start_us + span * acc / total, b))
            out[(r.rank, s.step)] = grads
    return out


def _param_bytes_in_ready_order(cfg: DDPModule | None) -> list[int]:
    if not cfg:
        return []
    params = [int(p.bytes or 0) for p in cfg.parameters]
    order = [i for i in cfg.grad_ready_order or [] if 0 <= i < len(params)]
    if len(order) != len(params):
        order = list(range(len(params)))[::-1]  # DDP's initial assumption: reverse definition order
    return [params[i] for i in order]


def _current_limits(analysis: Analysis, cfg: DDPModule | None) -> tuple[list[int], float | None]:
    """Limits that reproduce this run's layout: the recorded bucket sizes (manifest, else measured buckets), so a
    default first bucket of 1 MiB is reproduced too; else the configured cap."""
    cap_mb = float(cfg.bucket_cap_mb) if cfg and cfg.bucket_cap_mb is not None else None
    sizes = [int(b.bytes or 0) for b in cfg.buckets] if cfg else []
    if not (sizes and all(sizes)):
        by_step: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for b in analysis.buckets:
            by_step[(b.rank, b.step)].append((b.index, b.bytes or 0))
        if by_step:
            first = by_step[min(by_step)]
            sizes = [n for _, n in sorted(first)]
    if sizes and all(sizes):
        # A bucket closes at its recorded size; beyond the recorded layout, the configured cap applies.
        return sizes + [int((cap_mb or DEFAULT_BUCKET_CAP_MB) * MIB)], cap_mb
    return bucket_limits(cap_mb), cap_mb


def bucket_whatif(analysis: Analysis, caps_mb: Sequence[float] = CANDIDATE_CAPS_MB) -> WhatIf:
    """Predict exposed communication per step for each cap in ``caps_mb`` and recommend the best."""
    ranks_comm = [r for r in analysis.ranks if r.comm_us > 0]
    if not ranks_comm:
        return WhatIf(False, "no communication was recorded")
    bw = _bandwidth(analysis)
    if bw is None:
        return WhatIf(False, "no collective with a known size to measure bandwidth from")
    latency, rate, bw_source = bw
    cfg = ddp_config(analysis)
    param_bytes = _param_bytes_in_ready_order(cfg)
    steps, sized_by_buckets = _steps_from_trace(analysis, param_bytes)
    grad_source = "trace+bucket_sizes" if sized_by_buckets else "trace"
    if not steps:
        steps = _steps_interpolated(analysis, param_bytes)
        grad_source = "interpolated"
    if not steps:
        return WhatIf(False, "no gradient-ready times in the traces and no DDP parameter list to interpolate",
                      latency, rate, bw_source)

    per_step = {(r.rank, s.step): s for r in analysis.ranks for s in r.per_step}
    step_times = [s.dur_us for s in per_step.values()]
    lanes = observed_lanes(analysis.buckets)
    measured = [per_step[k].exposed_comm_us for k in steps if k in per_step]

    keys = sorted(steps)
    batch = StepBatch([(steps[k], st.backward_end_us if (st := per_step.get(k)) else None) for k in keys])
    backward_starts = [st.backward_start_us if (st := per_step.get(k)) else None for k in keys]

    def predict(limits: list[int]) -> StepOutcomes:
        return batch.simulate(limits, latency, rate, lanes)

    predictions = []
    for cap in caps_mb:
        sims = predict(bucket_limits(cap))
        firsts = [start - bs for start, bs in zip(sims.first_start_us, backward_starts, strict=True)
                  if start is not None and bs is not None]
        predictions.append(CapPrediction(
            float(cap),
            statistics.median(sims.buckets),
            statistics.median(sims.exposed_us),
            statistics.median(sims.comm_us),
            statistics.median(firsts) if firsts else None,
        ))
    cur_limits, cur_cap = _current_limits(analysis, cfg)
    cur_sims = predict(cur_limits)
    current = statistics.median(cur_sims.exposed_us)
    measured_counts: dict[tuple[int, int], int] = defaultdict(int)
    for b in analysis.buckets:
        measured_counts[(b.rank, b.step)] += 1
    step_time = statistics.median(step_times) if step_times else None

    tie = TIE_SHARE_OF_STEP * step_time if step_time else 0.0
    lowest = min(p.exposed_comm_us for p in predictions)
    tied = [p for p in predictions if p.exposed_comm_us <= lowest + tie]
    if current <= lowest + tie:
        best_cap, best_exposed = cur_cap, current
    else:
        best = max(tied, key=lambda p: p.bucket_cap_mb)
        best_cap, best_exposed = best.bucket_cap_mb, best.exposed_comm_us
    saving = max(0.0, current - best_exposed)
    measured_us = statistics.median(measured) if measured else None
    fit_error = (100.0 * abs(current - measured_us) / step_time) if (step_time and measured_us is not None) else None
    return WhatIf(
        True, None, latency, rate, bw_source, grad_source, len(steps), step_time, cur_cap, current,
        statistics.median(cur_sims.buckets),
        statistics.median(measured_counts.values()) if measured_counts else None,
        measured_us, fit_error, predictions, best_cap, best_exposed, saving,
        100.0 * saving / step_time if step_time else None,
        lanes,
    )

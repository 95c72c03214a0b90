"""Per-rank metrics (docs/metrics.md): compute C, communication M, overlap |M∩C|, exposed |M\\C|, idle, backward,
per ProfilerStep and in total, for the window "all" (every event) or "hta" (work launched before the last step)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from ddpdoctor.analyses import collectives as coll
from ddpdoctor.analyses.model import (
    Bucket,
    CollectiveCall,
    GradReady,
    InputInfo,
    RankMetrics,
    StepMetrics,
    SyncCall,
)
from ddpdoctor.traces import intervals as iv
from ddpdoctor.traces.model import Spans, Trace


@dataclass
class RankResult:
    """Everything one rank contributes; cross-rank analyses combine these (summary.json holds one)."""

    input: InputInfo
    metrics: RankMetrics
    calls: list[CollectiveCall]
    buckets: list[Bucket]
    grad_ready: list[GradReady]
    syncs: list[SyncCall] = field(default_factory=list)
    host: str | None = None
    notes: list[str] = field(default_factory=list)


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _comm_spans(trace: Trace) -> Spans:
    return Spans.of([(c.start, c.end, c.launch) for c in trace.comm])


def window_filter(trace: Trace, window: str) -> tuple[Spans, Spans, Spans, list[tuple[int, float, float]]]:
    """(compute, comm, memory, steps) kept by the window. "hta": work launched before the last ProfilerStep
    starts (GPU: by the launching runtime call; unknown launch dropped, as HTA drops it), and that step dropped.
    With fewer than two steps HTA keeps everything; so do we."""
    comp, comm, mem, steps = trace.compute, _comm_spans(trace), trace.memory, trace.steps
    if window != "hta" or len(steps) < 2:
        return comp, comm, mem, steps
    last = steps[-1][1]

    def keep(sp: Spans) -> Spans:
        launch = sp.launch
        return sp.select(~np.isnan(launch) & (launch < last))

    return keep(comp), keep(comm), keep(mem), steps[:-1]


def _in_step(sp: Spans, s: float, e: float, gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    """The step's part of the work: CPU work clipped to the step; GPU work launched in the step (not clipped,
    since kernels run after the CPU step that launched them)."""
    if not gpu:
        return iv.clip(sp.start, sp.end, s, e)
    t = np.where(np.isnan(sp.launch), sp.start, sp.launch)
    m = (t >= s) & (t < e)
    return sp.start[m], sp.end[m]


def backward_windows(trace: Trace, steps: list[tuple[int, float, float]]) -> dict[int, tuple[float, float, float, float]]:
    """step -> (cpu_start, cpu_end, start, end) of the backward pass. CPU: the autograd evaluate_function span.
    GPU: from the first to the last compute kernel launched inside that CPU span."""
    out: dict[int, tuple[float, float, float, float]] = {}
    b = trace.backward
    for sid, s, e in steps:
        m = (b.start >= s) & (b.start < e)
        if not m.any():
            continue
        cs, ce = float(b.start[m].min()), float(b.end[m].max())
        bs, be = cs, ce
        if trace.device == "gpu":
            lk = trace.compute.launch
            km = (lk >= cs) & (lk <= ce)
            if km.any():
                bs, be = float(trace.compute.start[km].min()), float(trace.compute.end[km].max())
        out[sid] = (cs, ce, bs, be)
    return out


def analyze_trace(trace: Trace, window: str = "all") -> RankResult:
    gpu = trace.device == "gpu"
    comp, comm, mem, steps = window_filter(trace, window)
    C, M, Mem = comp.pair(), comm.pair(), mem.pair()
    comm_us = iv.union_len(*M)
    compute_us = iv.union_len(*C)
    overlap_us = iv.intersect_len(M, C)
    bwd = backward_windows(trace, steps)
    data = trace.data_wait.pair()

    per_step: list[StepMetrics] = []
    for sid, s, e in steps:
        sc, sm, smem = _in_step(comp, s, e, gpu), _in_step(comm, s, e, gpu), _in_step(mem, s, e, gpu)
        s_comm = iv.union_len(*sm)
        s_ov = iv.intersect_len(sm, sc)
        busy = iv.union_len(*iv.cat(sc, sm, smem))
        bs = be = cbs = cbe = None
        cib = 0.0
        if sid in bwd:
            cbs, cbe, bs, be = bwd[sid]
            cib = iv.union_len(*iv.clip(sm[0], sm[1], bs, be))
        per_step.append(StepMetrics(
            step=sid, start_us=s, dur_us=e - s, compute_us=iv.union_len(*sc), comm_us=s_comm, overlap_us=s_ov,
            overlap_pct=_pct(s_ov, s_comm), exposed_comm_us=s_comm - s_ov, idle_us=max(0.0, (e - s) - busy),
            backward_start_us=bs, backward_end_us=be, comm_in_backward_us=cib,
            data_wait_us=iv.union_len(*iv.clip(data[0], data[1], s, e)),
            cpu_backward_start_us=cbs, cpu_backward_end_us=cbe,
        ))

    durs = [p.dur_us for p in per_step]
    step_total = sum(durs)
    if per_step:
        idle = sum(p.idle_us for p in per_step)
    else:
        allw = iv.cat(C, M, Mem)
        span = float(allw[1].max() - allw[0].min()) if len(allw[0]) else 0.0
        idle = max(0.0, span - iv.union_len(*allw))
    exposed = comm_us - overlap_us
    calls, launches = coll.rank_collectives(trace, bwd)
    if window == "hta" and len(trace.steps) >= 2:
        last = trace.steps[-1][1]
        kept = [i for i, t in enumerate(launches) if t is not None and t < last]
        calls, launches = [calls[i] for i in kept], [launches[i] for i in kept]
    metrics = RankMetrics(
        rank=trace.rank, world_size=trace.world_size, device=trace.device, backend=trace.backend,
        steps=len(per_step), step_ids=[p.step for p in per_step],
        step_time_us={"median": statistics.median(durs) if durs else None, "p90": _p(durs, 90),
                      "max": max(durs) if durs else None},
        compute_us=compute_us, comm_us=comm_us, overlap_us=overlap_us, overlap_pct=_pct(overlap_us, comm_us),
        exposed_comm_us=exposed, exposed_comm_pct=_pct(exposed, step_total) if per_step else None,
        idle_us=idle, memory_us=iv.union_len(*Mem),
        backward_us=sum(v[3] - v[2] for v in bwd.values()),
        comm_in_backward_us=sum(p.comm_in_backward_us for p in per_step),
        data_wait_us=sum(p.data_wait_us for p in per_step) if per_step else iv.union_len(*data),
        per_step=per_step,
    )
    return RankResult(
        input=InputInfo(path=trace.path, rank=trace.rank, rank_source=trace.rank_source, device=trace.device,
                        events=trace.n_events),
        metrics=metrics,
        calls=calls,
        buckets=coll.buckets(trace, calls, launches, bwd),
        grad_ready=coll.grad_ready(trace),
        syncs=[SyncCall(rank=trace.rank, step=coll.step_of(c.start, trace.steps), name=c.name, t_us=c.start,
                        dur_us=c.end - c.start) for c in trace.syncs],
        host=trace.host,
        notes=list(trace.notes),
    )

"""Per-rank metrics (docs/metrics.md): compute C, communication M, overlap |M∩C|, exposed |M\\C|, idle, backward,
per ProfilerStep and in total, for the window "all" (every event) or "hta" (work launched before the last step)."""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ddpdoctor.analyses import collectives as coll
from ddpdoctor.analyses.fsdp_units import unit_collectives
from ddpdoctor.analyses.results import (
    Bucket,
    CollectiveCall,
    GradReady,
    InputInfo,
    RankMetrics,
    StepMetrics,
    SyncCall,
    UnitCollective,
)
from ddpdoctor.traces import intervals as iv
from ddpdoctor.traces.trace import Spans, Trace

Pair = tuple[np.ndarray, np.ndarray]


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
    fsdp: list[UnitCollective] = field(default_factory=list)  # FSDP2 units' collectives (analyses/fsdp_units.py)


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


def _p(values: list[float], q: float) -> float | None:
    """np.percentile(values, q) (its default, linear method, to the bit): numpy's own pulls in numpy.ma, a tenth
    of the start-up of `analyze` on one trace."""
    if not values:
        return None
    v = sorted(values)
    x = (len(v) - 1) * (q / 100)
    if x >= len(v) - 1:
        return float(v[-1])
    lo = math.floor(x)
    t, a, b = x - lo, float(v[lo]), float(v[lo + 1])
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t  # numpy's _lerp, exact at either end


def _comm_spans(trace: Trace) -> Spans:
    return Spans.of(array("d", [x for c in trace.comm for x in (c.start, c.end, c.launch)]))


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


class _ByLaunch:
    """GPU work sorted by launch time (start where unknown): a step's work is one contiguous slice."""

    def __init__(self, sp: Spans) -> None:
        key = np.where(np.isnan(sp.launch), sp.start, sp.launch)
        order = np.argsort(key, kind="stable")
        self.key, self.start, self.end = key[order], sp.start[order], sp.end[order]

    def launched_in(self, lo: float, hi: float, closed: bool = False) -> tuple[np.ndarray, np.ndarray]:
        i0 = int(np.searchsorted(self.key, lo, side="left"))
        i1 = int(np.searchsorted(self.key, hi, side="right" if closed else "left"))
        return self.start[i0:i1], self.end[i0:i1]


def backward_passes(starts: np.ndarray, ends: np.ndarray, forward: _ByLaunch) -> list[tuple[float, float]]:
    """The backward passes among one step's autograd spans (sorted by start): a new pass begins where work outside
    backward (the next micro-step's forward) was launched between two spans. Gradient accumulation runs several."""
    # A pass ends where it has covered so far: the running maximum of the ends (a new pass starts after that point,
    # so its first end is the new maximum too). All gaps are tested at once: two binary searches per span, in numpy.
    reach = np.maximum.accumulate(ends)
    lo, hi = reach[:-1], starts[1:]
    launched = np.searchsorted(forward.key, hi, "left") - np.searchsorted(forward.key, lo, "left")
    firsts = [0, *(np.flatnonzero((hi > lo) & (launched > 0)) + 1).tolist()]
    lasts = [i - 1 for i in firsts[1:]] + [len(starts) - 1]
    return list(zip(starts[firsts].tolist(), reach[lasts].tolist(), strict=True))


def synced_pass(passes: list[tuple[float, float]], comm: _ByLaunch) -> int:
    """Index of the pass whose gradients DDP all_reduces: the last that launched communication (the others ran under
    ``no_sync``); the last pass when none did."""
    for i in range(len(passes) - 1, -1, -1):
        if len(comm.launched_in(passes[i][0], passes[i][1], closed=True)[0]):
            return i
    return len(passes) - 1


def backward_windows(trace: Trace, steps: list[tuple[int, float, float]],
                     passes_out: dict[int, int] | None = None) -> dict[int, tuple[float, float, float, float]]:
    """step -> (cpu_start, cpu_end, start, end) of the step's synced backward pass (docs/metrics.md). CPU: the
    autograd evaluate_function spans of that pass. GPU: from the first to the last compute kernel launched inside it.
    ``passes_out`` receives the number of backward passes per step (several with gradient accumulation)."""
    out: dict[int, tuple[float, float, float, float]] = {}
    b = trace.backward
    order = np.argsort(b.start, kind="stable")
    bst, ben = b.start[order], b.end[order]
    kernels = _ByLaunch(trace.compute) if trace.device == "gpu" else None
    # Work outside backward: CPU ops on a CPU trace, kernel launches on a GPU trace (both keyed by launch time).
    forward = kernels if kernels is not None else _ByLaunch(trace.compute)
    comm = _ByLaunch(_comm_spans(trace))
    for sid, s, e in steps:
        i0, i1 = int(np.searchsorted(bst, s, "left")), int(np.searchsorted(bst, e, "left"))
        if i1 <= i0:
            continue
        passes = backward_passes(bst[i0:i1], ben[i0:i1], forward)
        if passes_out is not None:
            passes_out[sid] = len(passes)
        cs, ce = passes[synced_pass(passes, comm)] if len(passes) > 1 else passes[0]
        bs, be = cs, ce
        if kernels is not None:
            ks, ke = kernels.launched_in(cs, ce, closed=True)
            if len(ks):
                bs, be = float(ks.min()), float(ke.max())
        out[sid] = (cs, ce, bs, be)
    return out


Bounds = list[tuple[float, float, "float | None", "float | None"]]  # per step: start, end, backward start, end
StepParts = Callable[[Bounds], list[tuple[float, ...]]]


def _step_parts_cpu(C: Pair, M: Pair, Mem: Pair, data: Pair) -> StepParts:
    """CPU work clipped to each step, on unions merged once, every step at once (covered length by cumulative sums:
    two binary searches per step and metric, in numpy)."""
    mC, mM, mCM = iv.merge(*C), iv.merge(*M), iv.merge(*iv.cat(C, M))
    mBusy, mData = iv.merge(*iv.cat(C, M, Mem)), iv.merge(*data)

    def parts(bounds: Bounds) -> list[tuple[float, ...]]:
        if not bounds:
            return []
        s = np.array([b[0] for b in bounds], dtype=np.float64)
        e = np.array([b[1] for b in bounds], dtype=np.float64)
        has_bwd = np.array([b[2] is not None and b[3] is not None for b in bounds])
        bs = np.array([b[2] if h else 0.0 for b, h in zip(bounds, has_bwd, strict=True)], dtype=np.float64)
        be = np.array([b[3] if h else 0.0 for b, h in zip(bounds, has_bwd, strict=True)], dtype=np.float64)
        comp, comm = iv.clipped_lens(*mC, s, e), iv.clipped_lens(*mM, s, e)
        ov = np.maximum(0.0, comp + comm - iv.clipped_lens(*mCM, s, e))
        cib = np.where(has_bwd, iv.clipped_lens(*mM, bs, be), 0.0)
        busy, dw = iv.clipped_lens(*mBusy, s, e), iv.clipped_lens(*mData, s, e)
        return list(zip(comp.tolist(), comm.tolist(), ov.tolist(), busy.tolist(), cib.tolist(), dw.tolist(),
                        strict=True))

    return parts


def _step_parts_gpu(comp: Spans, comm: Spans, mem: Spans, data: Pair) -> StepParts:
    """Kernels run after the CPU step that launched them: a step's GPU work is what it launched, not clipped."""
    kc, km, kmem, mData = _ByLaunch(comp), _ByLaunch(comm), _ByLaunch(mem), iv.merge(*data)

    def part(s: float, e: float, bs: float | None, be: float | None) -> tuple[float, ...]:
        sc, sm, smem = kc.launched_in(s, e), km.launched_in(s, e), kmem.launched_in(s, e)
        c, m = iv.union_len(*sc), iv.union_len(*sm)
        ov = iv.intersect_len(sm, sc)
        cib = iv.union_len(*iv.clip(sm[0], sm[1], bs, be)) if bs is not None and be is not None else 0.0
        return c, m, ov, iv.union_len(*iv.cat(sc, sm, smem)), cib, iv.clipped_len(*mData, s, e)

    return lambda bounds: [part(*b) for b in bounds]


def analyze_trace(trace: Trace, window: str = "all") -> RankResult:
    gpu = trace.device == "gpu"
    comp, comm, mem, steps = window_filter(trace, window)
    C, M, Mem = comp.pair(), comm.pair(), mem.pair()
    comm_us = iv.union_len(*M)
    compute_us = iv.union_len(*C)
    overlap_us = iv.intersect_len(M, C)
    n_passes: dict[int, int] = {}
    bwd = backward_windows(trace, steps, n_passes)
    notes = list(trace.notes)
    if len(steps) >= 3 and steps[-1][0] not in bwd and sum(1 for sid, _, _ in steps[:-1] if sid in bwd) * 2 >= len(steps) - 1:
        # The script ended (or failed) inside the last ProfilerStep: a step without backward among steps with one is
        # teardown, not training; its tiny duration would skew every per-step figure.
        notes.append(f"rank {trace.rank}: ProfilerStep#{steps[-1][0]} has no backward pass (the script ended or "
                     "failed inside it): left out of the per-step figures")
        steps = steps[:-1]
    data = trace.data_wait.pair()

    parts = _step_parts_gpu(comp, comm, mem, data) if gpu else _step_parts_cpu(C, M, Mem, data)
    none4: tuple[float | None, float | None, float | None, float | None] = (None, None, None, None)
    windows = [bwd.get(sid, none4) for sid, _, _ in steps]
    per_step: list[StepMetrics] = []
    for (sid, s, e), (cbs, cbe, bs, be), (s_comp, s_comm, s_ov, busy, cib, s_data) in zip(
            steps, windows, parts([(s, e, w[2], w[3]) for (_, s, e), w in zip(steps, windows, strict=True)]),
            strict=True):
        per_step.append(StepMetrics(
            step=sid, start_us=s, dur_us=e - s, compute_us=s_comp, comm_us=s_comm, overlap_us=s_ov,
            overlap_pct=_pct(s_ov, s_comm), exposed_comm_us=s_comm - s_ov, idle_us=max(0.0, (e - s) - busy),
            backward_start_us=bs, backward_end_us=be, comm_in_backward_us=cib, data_wait_us=s_data,
            cpu_backward_start_us=cbs, cpu_backward_end_us=cbe, backward_passes=n_passes.get(sid, 0),
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
    kept_steps = {p.step for p in per_step}
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
        notes=notes,
        fsdp=[u for u in unit_collectives(trace) if u.step in kept_steps],
    )

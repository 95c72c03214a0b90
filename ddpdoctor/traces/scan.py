"""Classifies a decoded trace's complete events (compute / communication / memory / steps / backward / data wait)
into flat columns, one pass (a Part). No numpy here: this runs in the processes that read a big trace's ranges,
which may start before the analyses (and numpy) are imported (traces/split.py); trace.py makes the Trace.

GPU traces: communication = NCCL/RCCL kernels, memory = Memcpy/Memset, compute = every other kernel.
CPU traces (gloo): communication = `gloo:*` work (on the pt_gloo_runloop threads); compute = the training
threads' CPU ops, not counting ProfilerStep wrappers, data loading (counted as data wait), waits, and the
c10d enqueue calls. See docs/metrics.md."""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import NoReturn

from ddpdoctor.errors import BadInput
from ddpdoctor.safe_io import clean_text
from ddpdoctor.traces.loader import (
    _CORRELATION,
    DECODE_ERRORS,
    AnyEvent,
    Event,
    EventArgs,
    XEvent,
    complete_events,
    decode_args,
)

_INF = float("inf")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_WAIT = re.compile(r"wait|synchronize", re.IGNORECASE)
BACKWARD_PREFIX = "autograd::engine::evaluate_function:"
DATA_PREFIX = "enumerate(DataLoader)"
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
SYNC_NAMES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "aten::item",
              "aten::_local_scalar_dense")
_CPU_CATS = {"cpu_op", "user_annotation", "python_function"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "cuda_api"}


def is_comm_kernel(name: str) -> bool:
    low = name.lower()
    return (low.startswith("nccl") and "kernel" in low) or "rccl" in low


def is_memory(name: str, cat: str) -> bool:
    return cat in ("gpu_memcpy", "gpu_memset") or name.startswith(("Memcpy", "Memset"))


@dataclass(slots=True)  # one per collective: no __dict__ (200,000 of them in a long trace)
class CommEvent:
    name: str
    start: float
    end: float
    launch: float  # NaN when unknown
    tid: int | str
    args: EventArgs


@dataclass(slots=True)
class CpuCall:
    name: str
    start: float
    end: float
    args: EventArgs | None


K_STEP, K_COMM, K_ENQ, K_GRAD, K_DATA, K_COMPUTE, K_BWD = 1, 2, 4, 8, 16, 32, 64
K_GCOMM, K_GMEM, K_GCOMP, K_RUNTIME, K_SYNC, K_FSDP = 128, 256, 512, 1024, 2048, 4096
FSDP_PREFIX = "FSDP::"  # FSDP2's own record_function ranges (torch/distributed/fsdp/_fully_shard)
K_GPU = K_GCOMM | K_GMEM | K_GCOMP


def classify(name: str, cat: str, has_gpu: bool) -> int:
    """What an 'X' event is, as K_* flags (0: not used by any analysis)."""
    if has_gpu and cat in ("kernel", "gpu_memcpy", "gpu_memset"):
        if cat == "kernel" and is_comm_kernel(name):
            return K_GCOMM
        return K_GMEM if is_memory(name, cat) else K_GCOMP
    k = K_SYNC if name.startswith(SYNC_NAMES) else 0
    if has_gpu and cat in _RUNTIME_CATS:
        return k | K_RUNTIME
    if name.startswith("ProfilerStep#"):
        return k | K_STEP if cat in _CPU_CATS else k
    if name.startswith("gloo:"):
        return k | (0 if has_gpu else K_COMM)
    if name.startswith(("c10d::", "record_param_comms", "nccl:")):
        return k | K_ENQ
    if name.startswith(FSDP_PREFIX) and cat in _CPU_CATS:
        # FSDP2's hooks: wrappers around its all-gathers, reduce-scatters and their waits, never compute
        return k | K_FSDP
    if name.startswith(BACKWARD_PREFIX):
        k |= K_BWD
    if name == ACCUMULATE_GRAD:
        k |= K_GRAD
    if name.startswith(DATA_PREFIX):
        return k | K_DATA
    if not has_gpu and cat in _CPU_CATS and not _WAIT.search(name):
        k |= K_COMPUTE
    return k


def bad_duration(ev: Event | XEvent, path: str) -> NoReturn:
    raise BadInput(f"event {clean_text(ev.name)[:80]!r} at ts {ev.ts} has duration {ev.dur}: durations must be "
                   "finite and >= 0 (a damaged or hand-edited trace)", path)


@dataclass
class Part:
    """A run of events reduced to columns: a whole trace, or one byte range of a big GPU trace's events reduced in a
    worker process (traces/split.py). Only these columns cross a process boundary; `join_parts` makes the Trace."""

    n_events: int = 0
    has_kernels: bool = False  # an 'X' event of category "kernel" among these events
    steps: list[tuple[int, float, float]] = field(default_factory=list)
    # Flat (start, end, launch-or-correlation) rows: 24 bytes a row, no tuples.
    compute: array = field(default_factory=lambda: array("d"))
    memory: array = field(default_factory=lambda: array("d"))
    backward: array = field(default_factory=lambda: array("d"))
    data: array = field(default_factory=lambda: array("d"))
    comm: list[CommEvent] = field(default_factory=list)
    enqueues: list[CpuCall] = field(default_factory=list)
    grads: list[CpuCall] = field(default_factory=list)
    syncs: list[CpuCall] = field(default_factory=list)
    fsdp: list[CpuCall] = field(default_factory=list)  # FSDP2's record_function ranges (FSDP::all_gather (fqn), ...)
    runtime: dict[int, float] = field(default_factory=dict)  # correlation id -> CPU time of the launching call
    # A CPU trace's compute ops (nearly all of its events), in event order: their columns are built in C, by
    # trace.join_parts (CPU traces are read in the process that holds the whole trace, never split).
    cpu_compute: list[Event | XEvent] | None = None


def scan(events: list[AnyEvent], has_gpu: bool, gloo_tids: set[tuple[int | str, int | str]], path: str) -> Part:
    """Classify every complete ('X') event once, into columns."""
    return scan_complete(complete_events(events), len(events), has_gpu, gloo_tids, path)


def scan_complete(xs: list[Event | XEvent], n_events: int, has_gpu: bool, gloo_tids: set[tuple[int | str, int | str]],
                  path: str, fsdp_filter: bool = True) -> Part:
    """scan, given the complete events (complete_events) and the count of all events. ``fsdp_filter`` False: the
    compute ops are kept whole, FSDP's wrappers among them too (a range of a trace: traces/chunks.py filters them
    once it has every FSDP range)."""
    part = Part(n_events=n_events)
    gloo_thread_ids = {tid for _, tid in gloo_tids}  # a plain tid test first: no (pid, tid) tuple per event
    steps = part.steps
    compute, memory, backward, data = part.compute, part.memory, part.backward, part.data
    comm, enqueues, grads, syncs, runtime = part.comm, part.enqueues, part.grads, part.syncs, part.runtime
    fsdp = part.fsdp
    # A CPU trace's compute ops (nearly all of its events) are only collected here, in event order; their columns
    # are built afterwards in C (trace.join_parts): per event, one list append instead of arithmetic and a check.
    cpu_compute: list[Event | XEvent] = []
    keep = cpu_compute.append
    nan = float("nan")
    # Names repeat: each (category, name) is classified once. A dict per category: no (name, cat) tuple per event.
    kinds: dict[str, dict[str, int]] = {}
    corr = _CORRELATION.decode
    for ev in xs:
        name = ev.name
        of_cat = kinds.get(ev.cat)
        if of_cat is None:
            of_cat = kinds[ev.cat] = {}
        k = of_cat.get(name)
        if k is None:
            k = of_cat[name] = classify(name, ev.cat, has_gpu)
        if not k:
            continue
        if k == K_COMPUTE:  # most events of a CPU trace: one test instead of the chain below
            if ev.tid not in gloo_thread_ids or (ev.pid, ev.tid) not in gloo_tids:
                keep(ev)
            continue
        ts = ev.ts
        end = ts + ev.dur
        if not (ev.dur >= 0.0 and -_INF < end < _INF):  # NaN fails every comparison
            bad_duration(ev, path)
        if k & K_GPU:
            # The third slot holds the correlation id until the runtime calls are known (they may come later).
            if k & K_GCOMM:
                a = decode_args(ev.args)
                comm.append(CommEvent(name, ts, end, nan if a.correlation is None else float(a.correlation),
                                      ev.tid, a))
            else:
                try:  # args.correlation alone (a decoder of that one field, inline: one call per kernel)
                    c = corr(ev.args).correlation
                except DECODE_ERRORS:
                    c = None
                (memory if k & K_GMEM else compute).extend((ts, end, nan if c is None else float(c)))
            continue
        if k & K_SYNC:
            syncs.append(CpuCall(name, ts, end, None))
        if k & K_RUNTIME:
            try:
                c = corr(ev.args).correlation
            except DECODE_ERRORS:
                c = None
            if c is not None:
                runtime[c] = ts
            continue
        if k & K_FSDP:
            fsdp.append(CpuCall(name, ts, end, None))
            continue
        if k & K_STEP:
            m = _STEP.match(name)
            if m:
                steps.append((int(m.group(1)), ts, end))
            continue
        if k & K_COMM:
            comm.append(CommEvent(name, ts, end, ts, ev.tid, decode_args(ev.args)))
            continue
        if k & K_ENQ:
            enqueues.append(CpuCall(name, ts, end, decode_args(ev.args)))
            continue
        if k & K_BWD:
            backward.extend((ts, end, ts))
        if k & K_GRAD:
            grads.append(CpuCall(name, ts, end, decode_args(ev.args)))
        if k & K_DATA:
            data.extend((ts, end, ts))
            continue
        if k & K_COMPUTE and (ev.pid, ev.tid) not in gloo_tids:
            keep(ev)
    part.has_kernels = "kernel" in kinds
    if cpu_compute and fsdp and fsdp_filter:
        cpu_compute = without_fsdp_wrappers(cpu_compute, fsdp)
    if cpu_compute:
        part.cpu_compute = cpu_compute
    return part


def without_fsdp_wrappers(events: list[Event | XEvent], fsdp: list[CpuCall]) -> list[Event | XEvent]:
    """The CPU ops that are compute under FSDP2: an op whose span holds one of FSDP's own ranges (the autograd
    node that runs FSDP's pre-backward hook, RegisterPostBackwardFunctionBackward, a module's python_function)
    is a wrapper around FSDP's all-gather or reduce-scatter and its ``work.wait()``; the ops inside it still
    count, the wait does not (docs/metrics.md, "FSDP2 on CPU")."""
    keep = compute_mask([ev.ts for ev in events], [ev.ts + ev.dur for ev in events], fsdp)
    return [ev for ev, k in zip(events, keep, strict=True) if k]


def compute_mask(starts: list[float], ends: list[float], fsdp: list[CpuCall]) -> list[bool]:
    """For each op (start, end), whether it is compute under FSDP2 (without_fsdp_wrappers). One binary search per
    op: the FSDP ranges starting inside it are checked until the first that also ends inside it."""
    from bisect import bisect_left

    ranges = sorted((c.start, c.end) for c in fsdp)
    first = [r[0] for r in ranges]
    out: list[bool] = []
    for ts, end in zip(starts, ends, strict=True):
        i = bisect_left(first, ts)
        wraps = False
        while i < len(ranges) and ranges[i][0] <= end:
            # the same span on both: the op runs inside FSDP's range (FSDP's ranges only wrap)
            if ranges[i][1] <= end and (ranges[i][0] > ts or ranges[i][1] < end):
                wraps = True
                break
            i += 1
        out.append(not wraps)
    return out

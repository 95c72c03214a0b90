"""Classifies a decoded trace's events (compute / communication / memory / steps / backward / data wait) into columns.

GPU traces: communication = NCCL/RCCL kernels, memory = Memcpy/Memset, compute = every other kernel.
CPU traces (gloo): communication = `gloo:*` work (on the pt_gloo_runloop threads); compute = the training
threads' CPU ops, not counting ProfilerStep wrappers, data loading (counted as data wait), waits, and the
c10d enqueue calls. See docs/metrics.md."""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import NoReturn

import numpy as np

from ddpdoctor.errors import BadInput
from ddpdoctor.safe_io import clean_text
from ddpdoctor.traces.loader import Event, EventArgs, RawTrace, decode_args, rank_from_filename

_INF = float("inf")
_TS, _DUR = attrgetter("ts"), attrgetter("dur")
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


@dataclass
class Spans:
    start: np.ndarray
    end: np.ndarray
    launch: np.ndarray  # CPU time the work was launched (GPU: the runtime call; CPU: = start); NaN if unknown

    @staticmethod
    def of(flat: array) -> Spans:
        """From a flat array of (start, end, launch) rows."""
        a = np.frombuffer(flat, dtype=np.float64).reshape(-1, 3) if len(flat) else np.empty((0, 3))
        return Spans(a[:, 0].copy(), a[:, 1].copy(), a[:, 2].copy())

    def __len__(self) -> int:
        return len(self.start)

    def select(self, mask: np.ndarray) -> Spans:
        return Spans(self.start[mask], self.end[mask], self.launch[mask])

    def pair(self) -> tuple[np.ndarray, np.ndarray]:
        return self.start, self.end


@dataclass
class CommEvent:
    name: str
    start: float
    end: float
    launch: float  # NaN when unknown
    tid: int | str
    args: EventArgs


@dataclass
class CpuCall:
    name: str
    start: float
    end: float
    args: EventArgs | None


@dataclass
class Trace:
    path: str
    rank: int
    rank_source: str
    world_size: int | None
    backend: str | None
    host: str | None
    device: str
    n_events: int
    groups: dict[str, int]  # process group name -> size
    steps: list[tuple[int, float, float]]  # (id, start, end), CPU clock
    compute: Spans
    comm: list[CommEvent]
    memory: Spans
    backward: Spans  # CPU autograd evaluate_function events
    data_wait: Spans
    enqueues: list[CpuCall]  # c10d::* / record_param_comms on the CPU
    grads: list[CpuCall]  # AccumulateGrad
    syncs: list[CpuCall] = field(default_factory=list)  # calls that block the CPU on the device
    notes: list[str] = field(default_factory=list)


K_STEP, K_COMM, K_ENQ, K_GRAD, K_DATA, K_COMPUTE, K_BWD = 1, 2, 4, 8, 16, 32, 64
K_GCOMM, K_GMEM, K_GCOMP, K_RUNTIME, K_SYNC = 128, 256, 512, 1024, 2048
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
    if name.startswith(BACKWARD_PREFIX):
        k |= K_BWD
    if name == ACCUMULATE_GRAD:
        k |= K_GRAD
    if name.startswith(DATA_PREFIX):
        return k | K_DATA
    if not has_gpu and cat in _CPU_CATS and not _WAIT.search(name):
        k |= K_COMPUTE
    return k


def _bad_duration(ev: Event, path: str) -> NoReturn:
    raise BadInput(f"event {clean_text(ev.name)[:80]!r} at ts {ev.ts} has duration {ev.dur}: durations must be "
                   "finite and >= 0 (a damaged or hand-edited trace)", path)


def _cpu_compute(events: list[Event], path: str) -> Spans:
    """Columns of a CPU trace's compute ops (launch = start), with the same duration check as every other event."""
    n = len(events)
    start = np.fromiter(map(_TS, events), dtype=np.float64, count=n)
    dur = np.fromiter(map(_DUR, events), dtype=np.float64, count=n)
    end = start + dur
    with np.errstate(invalid="ignore"):
        bad = ~((dur >= 0.0) & np.isfinite(end))
    if bad.any():
        _bad_duration(events[int(np.argmax(bad))], path)
    return Spans(start, end, start.copy())


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
    runtime: dict[int, float] = field(default_factory=dict)  # correlation id -> CPU time of the launching call
    cpu_compute: Spans | None = None  # CPU traces only (built in the process that holds the whole trace)


def scan(events: list[Event], has_gpu: bool, gloo_tids: set[tuple[int | str, int | str]], path: str) -> Part:
    """Classify every complete ('X') event once, into columns."""
    part = Part(n_events=len(events))
    gloo_thread_ids = {tid for _, tid in gloo_tids}  # a plain tid test first: no (pid, tid) tuple per event
    steps = part.steps
    compute, memory, backward, data = part.compute, part.memory, part.backward, part.data
    comm, enqueues, grads, syncs, runtime = part.comm, part.enqueues, part.grads, part.syncs, part.runtime
    # A CPU trace's compute ops (nearly all of its events) are only collected here, in event order; their columns
    # are built afterwards in C (_cpu_compute): per event, one list append instead of arithmetic and a check.
    cpu_compute: list[Event] = []
    keep = cpu_compute.append
    nan = float("nan")
    kinds: dict[tuple[str, str], int] = {}  # names repeat: classify each (name, cat) once
    for ev in events:
        if ev.ph != "X":
            continue
        name, cat = ev.name, ev.cat
        k = kinds.get((name, cat))
        if k is None:
            k = kinds[(name, cat)] = classify(name, cat, has_gpu)
        if not k:
            continue
        if k == K_COMPUTE:  # most events of a CPU trace: one test instead of the chain below
            if ev.tid not in gloo_thread_ids or (ev.pid, ev.tid) not in gloo_tids:
                keep(ev)
            continue
        ts = ev.ts
        end = ts + ev.dur
        if not (ev.dur >= 0.0 and -_INF < end < _INF):  # NaN fails every comparison
            _bad_duration(ev, path)
        if k & K_GPU:
            # The third slot holds the correlation id until the runtime calls are known (they may come later).
            a = decode_args(ev.args)
            corr = nan if a.correlation is None else float(a.correlation)
            if k & K_GCOMM:
                comm.append(CommEvent(name, ts, end, corr, ev.tid, a))
            else:
                (memory if k & K_GMEM else compute).extend((ts, end, corr))
            continue
        if k & K_SYNC:
            syncs.append(CpuCall(name, ts, end, None))
        if k & K_RUNTIME:
            a = decode_args(ev.args)
            if a.correlation is not None:
                runtime[a.correlation] = ts
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
    part.has_kernels = any(cat == "kernel" for _, cat in kinds)
    if cpu_compute:
        part.cpu_compute = _cpu_compute(cpu_compute, path)
    return part


def build_trace(raw: RawTrace, fallback_rank: int | None = None) -> Trace:
    """Classify every complete ('X') event once."""
    events = raw.events
    gloo_tids: set[tuple[int | str, int | str]] = set()
    for ev in [e for e in events if e.ph == "M"]:  # a comprehension: the loop body runs for the few metadata events
        if ev.name == "thread_name":
            label = decode_args(ev.args).name
            if isinstance(label, str) and "pt_gloo_runloop" in label:
                gloo_tids.add((ev.pid, ev.tid))
    has_gpu = "kernel" in {ev.cat for ev in events if ev.ph == "X"}  # a comprehension: no generator per event
    return join_parts(raw, [scan(events, has_gpu, gloo_tids, raw.path)], has_gpu, fallback_rank)


def _joined(parts: list[Part], name: str) -> array:
    cols = [getattr(p, name) for p in parts]
    if len(cols) == 1:
        return cols[0]
    out = array("d")
    for c in cols:
        out.extend(c)
    return out


def join_parts(raw: RawTrace, parts: list[Part], has_gpu: bool, fallback_rank: int | None = None) -> Trace:
    """One trace from the columns of its parts (in event order) and its file's metadata (``raw.events`` unused)."""
    dist = raw.dist
    notes = list(raw.notes)
    if dist is not None and dist.rank is not None:
        rank, source = int(dist.rank), "distributedInfo"
    elif (r := rank_from_filename(raw.path)) is not None:
        rank, source = r, "filename"
    else:
        rank, source = (fallback_rank or 0), "order"
        notes.append(f"{Path(raw.path).name}: no distributedInfo and no rank in the file name; rank {rank} by order")
    groups: dict[str, int] = {}
    if dist is not None and dist.pg_config:
        for pg in dist.pg_config:
            if pg.pg_name is not None and pg.pg_size:
                groups[pg.pg_name] = int(pg.pg_size)

    one = parts[0] if len(parts) == 1 else None
    comm = one.comm if one else [c for p in parts for c in p.comm]
    runtime = one.runtime if one else {}
    if not one:
        for p in parts:
            runtime.update(p.runtime)  # in event order: a repeated correlation id keeps its last call, as in one pass
    cpu_comp = one.cpu_compute if one else None
    comp = cpu_comp if cpu_comp is not None else Spans.of(_joined(parts, "compute"))
    mem = Spans.of(_joined(parts, "memory"))
    nan = float("nan")
    if has_gpu:
        # Launch time of each kernel = the runtime call with its correlation id (for steps and HTA's window).
        def launch_of(corr: float) -> float:
            return nan if corr != corr else runtime.get(int(corr), nan)

        comp.launch = np.array([launch_of(c) for c in comp.launch], dtype=np.float64)
        mem.launch = np.array([launch_of(c) for c in mem.launch], dtype=np.float64)
        for c in comm:
            c.launch = launch_of(c.launch)
    comm.sort(key=lambda c: c.start)
    steps = one.steps if one else [s for p in parts for s in p.steps]
    steps.sort(key=lambda s: s[1])
    return Trace(
        path=raw.path,
        rank=rank,
        rank_source=source,
        world_size=dist.world_size if dist else None,
        backend=dist.backend if dist else None,
        host=raw.host,
        device="gpu" if has_gpu else "cpu",
        n_events=sum(p.n_events for p in parts),
        groups=groups,
        steps=steps,
        compute=comp,
        comm=comm,
        memory=mem,
        backward=Spans.of(_joined(parts, "backward")),
        data_wait=Spans.of(_joined(parts, "data")),
        enqueues=sorted((c for p in parts for c in p.enqueues), key=lambda c: c.start),
        grads=sorted((c for p in parts for c in p.grads), key=lambda c: c.end),
        syncs=[c for p in parts for c in p.syncs],
        notes=notes,
    )

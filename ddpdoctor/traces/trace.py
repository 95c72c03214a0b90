"""A rank's trace as columns (Trace): the Parts of traces/scan.py joined, kernels given their launch times.
See docs/metrics.md."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

import numpy as np

from ddpdoctor.traces.loader import (
    Event,
    RawTrace,
    XEvent,
    complete_events,
    decode_args,
    metadata_events,
    rank_from_filename,
)
from ddpdoctor.traces.scan import CommEvent, CpuCall, Part, bad_duration, scan_complete

__all__ = ["CommEvent", "CpuCall", "Part", "Spans", "Trace", "build_trace", "join_parts"]

_TS, _DUR = attrgetter("ts"), attrgetter("dur")


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
    fsdp: list[CpuCall] = field(default_factory=list)  # FSDP2's own record_function ranges, by start
    notes: list[str] = field(default_factory=list)


def _cpu_compute(events: list[Event | XEvent], path: str) -> Spans:
    """Columns of a CPU trace's compute ops (launch = start), with the same duration check as every other event."""
    n = len(events)
    start = np.fromiter(map(_TS, events), dtype=np.float64, count=n)
    dur = np.fromiter(map(_DUR, events), dtype=np.float64, count=n)
    end = start + dur
    with np.errstate(invalid="ignore"):
        bad = ~((dur >= 0.0) & np.isfinite(end))
    if bad.any():
        bad_duration(events[int(np.argmax(bad))], path)
    return Spans(start, end, start.copy())


def build_trace(raw: RawTrace, fallback_rank: int | None = None) -> Trace:
    """Classify every complete ('X') event once."""
    events = raw.events
    gloo_tids: set[tuple[int | str, int | str]] = set()
    for ev in metadata_events(events):
        if ev.name == "thread_name":
            label = decode_args(ev.args).name
            if isinstance(label, str) and "pt_gloo_runloop" in label:
                gloo_tids.add((ev.pid, ev.tid))
    xs = complete_events(events)
    has_gpu = "kernel" in {ev.cat for ev in xs}  # a comprehension: no generator per event
    return join_parts(raw, [scan_complete(xs, len(events), has_gpu, gloo_tids, raw.path)], has_gpu, fallback_rank)


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
    cpu_events = one.cpu_compute if one else None
    comp = _cpu_compute(cpu_events, raw.path) if cpu_events else Spans.of(_joined(parts, "compute"))
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
        fsdp=sorted((c for p in parts for c in p.fsdp), key=lambda c: c.start),
        notes=notes,
    )

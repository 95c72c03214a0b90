"""Collective calls of one rank: op, group, bytes, launch time (the CPU enqueue), algbw/busbw; DDP buckets per step."""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections import defaultdict, deque
from typing import Any

from ddpdoctor.analyses.results import Bucket, CollectiveCall, GradReady
from ddpdoctor.traces.loader import EventArgs
from ddpdoctor.traces.scan import CommEvent, CpuCall
from ddpdoctor.traces.trace import Trace

DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::float": 4, "double": 8, "float64": 8, "c10::half": 2, "half": 2, "float16": 2,
    "c10::bfloat16": 2, "bfloat16": 2, "long int": 8, "long": 8, "int64": 8, "int": 4, "int32": 4,
    "unsigned char": 1, "byte": 1, "uint8": 1, "signed char": 1, "char": 1, "int8": 1, "bool": 1, "short int": 2,
    "short": 2, "int16": 2, "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}
_OPS = {
    "allreduce": "all_reduce", "allreducecoalesced": "all_reduce", "allgather": "all_gather",
    "allgatherbase": "all_gather", "allgatherintotensorcoalesced": "all_gather", "reducescatter": "reduce_scatter",
    "reducescatterbase": "reduce_scatter", "reducescattertensorcoalesced": "reduce_scatter",
    "broadcast": "broadcast", "sendrecv": "send_recv", "send": "send", "recv": "recv", "barrier": "barrier",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
}
# busbw = algbw * factor(n): the NCCL-tests convention.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 1.0,
}
_KERNEL_OP = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)


@functools.lru_cache(maxsize=4096)  # a few names, repeated at every call of every step
def op_name(text: str) -> str:
    """all_reduce for gloo:all_reduce, c10d::allreduce_, allreduce, ncclDevKernel_AllReduce_Sum_f32_RING_LL."""
    m = _KERNEL_OP.match(text)
    if m:
        text = m.group(1)
    key = re.sub(r"^(gloo:|c10d::|nccl:)", "", text.strip().lower()).replace("_", "")
    return _OPS.get(key, key or "unknown")


def dtype_bytes(name: Any) -> int | None:
    if not isinstance(name, str):
        return None
    return DTYPE_BYTES.get(name.strip().lower())


def _nelems(dims: Any) -> int | None:
    """Elements of the first input: a tensor ([d0, d1]) or a TensorList ([[d0], [d1]])."""
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if isinstance(first, list) and first and all(isinstance(x, list) and all(isinstance(v, int) for v in x)
                                                 for x in first):
        return sum(math.prod(t) for t in first)
    if isinstance(first, list) and all(isinstance(x, int) for x in first):
        return math.prod(first) if first else None
    return None


def args_bytes(a: EventArgs | None) -> int | None:
    """Bytes of a collective from record_param_comms-style args, else Input Dims x Input type."""
    if a is None:
        return None
    if a.in_nelems is not None and (size := dtype_bytes(a.dtype)) is not None:
        return int(max(a.in_nelems, a.out_nelems or 0) * size) if a.out_nelems else int(a.in_nelems * size)
    n = _nelems(a.input_dims)
    types = a.input_type if isinstance(a.input_type, list) else []
    size = dtype_bytes(types[0]) if types else None
    return int(n * size) if n is not None and size is not None else None


def _enqueue_launches(comm: list[CommEvent], enqueues: list[CpuCall]) -> list[CpuCall | None]:
    """Pair each gloo work item with the c10d call that enqueued it: same op, same size, enqueued no later, in order.
    (Their External ids do not match on gloo, so order, size and time are all there is.)"""
    pending: dict[str, deque[tuple[CpuCall, int | None]]] = defaultdict(deque)
    for e in enqueues:  # sorted by start
        if e.name.startswith("c10d::"):
            pending[op_name(e.name)].append((e, _nelems(e.args.input_dims) if e.args else None))
    out: list[CpuCall | None] = []
    for c in comm:
        op, n = op_name(c.name), _nelems(c.args.input_dims)
        queue = pending.get(op)
        found = None
        if queue:
            # Usually the oldest pending call of the op; look a few further for a size match (two work threads).
            for i in range(min(len(queue), 8)):
                e, en = queue[i]
                if e.start > c.start:
                    break
                if n is None or en is None or n == en:
                    found = e
                    del queue[i]
                    break
        out.append(found)
    return out


def step_of(t: float, steps: list[tuple[int, float, float]]) -> int | None:
    """The step whose [start, end) holds t (steps sorted by start and not overlapping)."""
    i = bisect.bisect_right(steps, t, key=lambda s: s[1]) - 1
    if i >= 0 and steps[i][1] <= t < steps[i][2]:
        return steps[i][0]
    return None


def rank_collectives(
    trace: Trace, bwd: dict[int, tuple[float, float, float, float]]
) -> tuple[list[CollectiveCall], list[float | None]]:
    """bwd: step -> (cpu_bwd_start, cpu_bwd_end, bwd_start, bwd_end) on the work's own clock."""
    launches: list[float | None]
    enqueued: list[CpuCall | None] = [None] * len(trace.comm)
    if trace.device == "cpu":
        enqueued = _enqueue_launches(trace.comm, trace.enqueues)
        launches = [e.start if e else None for e in enqueued]
        sizes = [args_bytes(c.args) for c in trace.comm]
    else:
        launches = [None if c.launch != c.launch else c.launch for c in trace.comm]
        sizes = [args_bytes(c.args) for c in trace.comm]
        if any(s is None for s in sizes):
            rpc = [e for e in trace.enqueues if e.name == "record_param_comms" and args_bytes(e.args) is not None]
            if len(rpc) == len(trace.comm):  # one record per kernel: pair by order
                sizes = [s if s is not None else args_bytes(r.args) for s, r in zip(sizes, rpc, strict=True)]
    calls: list[CollectiveCall] = []
    seq_by_group: dict[str | None, int] = {}
    for i, (c, launch, nbytes, enq) in enumerate(zip(trace.comm, launches, sizes, enqueued, strict=True)):
        op = op_name(c.args.collective or c.name)
        cid = c.args.comms_id if c.args.comms_id is not None else (enq.args.comms_id if enq and enq.args else None)
        group = c.args.pg_name if c.args.pg_name is not None else (next(iter(trace.groups)) if len(trace.groups) == 1 else None)
        seq = c.args.seq
        if seq is None:
            seq_by_group[group] = seq_by_group.get(group, -1) + 1
        step = step_of(launch if launch is not None else c.start, trace.steps)
        dur = c.end - c.start
        n = c.args.group_size or (trace.groups.get(group) if group is not None else None) or trace.world_size
        algbw = nbytes / dur / 1e3 if nbytes and dur > 0 else None
        factor = BUS_FACTOR.get(op)
        busbw = algbw * factor(n) if algbw is not None and factor and n and n > 0 else None
        rel = c.start - bwd[step][2] if step in bwd else None
        calls.append(CollectiveCall(
            rank=trace.rank, index=i, step=step, op=op, group=group, seq=seq, bytes=nbytes,
            start_us=c.start, dur_us=dur, end_us=c.end, start_rel_backward_us=rel,
            algbw_gbps=algbw, busbw_gbps=busbw, launch_us=launch, comms_id=None if cid is None else str(cid),
        ))
    return calls, launches


def buckets(
    trace: Trace, calls: list[CollectiveCall], launches: list[float | None],
    bwd: dict[int, tuple[float, float, float, float]],
) -> list[Bucket]:
    """DDP buckets = the all_reduce calls launched (enqueued on the CPU) during the step's backward pass."""
    out: list[Bucket] = []
    by_step: dict[int | None, list[tuple[CollectiveCall, float]]] = defaultdict(list)
    for c, t in zip(calls, launches, strict=True):  # one pass: each step then looks at its own calls only
        if c.op == "all_reduce":
            by_step[c.step].append((c, t if t is not None else c.start_us))
    for step, (cs, ce, _bs, be) in sorted(bwd.items()):
        mine = [c for c, t in by_step.get(step, ()) if cs <= t <= ce]
        for k, c in enumerate(mine):
            out.append(Bucket(
                rank=trace.rank, step=step, index=k, bytes=c.bytes, start_us=c.start_us, end_us=c.end_us,
                dur_us=c.dur_us, is_last=k == len(mine) - 1, after_backward_end_us=max(0.0, c.end_us - be),
            ))
    return out


def grad_ready(trace: Trace) -> list[GradReady]:
    out = []
    for g in trace.grads:
        out.append(GradReady(rank=trace.rank, step=step_of(g.start, trace.steps), t_us=g.end, bytes=args_bytes(g.args)))
    return out

"""The records one rank's trace reduces to (ranks/rankR/summary.json): its inputs, per-step and total metrics,
collective calls, DDP buckets, gradient-ready times and syncing calls. The analyses compute them
(analyses/rank.py) and read them back; they live here, with the run directory's schema that stores them, so the
run directory depends on nothing above it.

All times are microseconds (floats). ``None`` means "not measurable" (e.g. overlap_pct of a rank with no
communication), never NaN. Timestamps are on rank 0's clock after clock alignment."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

_FIELDS: dict[type, tuple[str, ...]] = {}
_ATOMS = (str, int, float, bool, type(None))
_ATOM_TYPES = frozenset(_ATOMS)


def asdict(obj: Any) -> Any:
    """dataclasses.asdict for these result types, without its deep copy of every number: the same dicts and lists,
    a tenth of the time (at 40,000 steps or 1,024 ranks, asdict was most of analyze's time after the traces)."""
    if isinstance(obj, _ATOMS):
        return obj
    cls = type(obj)
    names = _FIELDS.get(cls)
    if names is None and is_dataclass(obj):
        names = _FIELDS[cls] = tuple(f.name for f in fields(obj))
    if names is not None:
        out = {}
        for n in names:  # a number or a string is itself: no call per field (most fields of a per-step record)
            v = getattr(obj, n)
            out[n] = v if type(v) in _ATOM_TYPES else asdict(v)
        return out
    if isinstance(obj, dict):
        return {k: v if type(v) in _ATOM_TYPES else asdict(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [v if type(v) in _ATOM_TYPES else asdict(v) for v in obj]
    if isinstance(obj, tuple):
        items = [asdict(v) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


@dataclass
class InputInfo:
    """One trace file (or per-rank summary) the analysis used."""

    path: str
    rank: int
    rank_source: str  # "distributedInfo" | "filename" | "order" | "summary"
    device: str  # "cpu" | "gpu"
    events: int


@dataclass(slots=True)  # one per step or call: thousands to millions of them
class StepMetrics:
    """One ProfilerStep#N window of one rank."""

    step: int
    start_us: float
    dur_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    overlap_pct: float | None  # 100*overlap/comm; None iff comm_us == 0
    exposed_comm_us: float
    idle_us: float
    backward_start_us: float | None
    backward_end_us: float | None
    comm_in_backward_us: float
    data_wait_us: float
    # The backward pass as the CPU ran it (on GPU traces backward_*_us are the GPU span of its kernels).
    cpu_backward_start_us: float | None = None
    cpu_backward_end_us: float | None = None
    # Backward passes in this step (gradient accumulation: several, the ones under no_sync and the synced one). The
    # backward_* windows above are the synced pass's: buckets, overlap, tail and sync calls read that one.
    backward_passes: int = 1


@dataclass
class RankMetrics:
    """Totals over the recorded steps of one rank (per_step holds each step)."""

    rank: int
    world_size: int | None
    device: str
    backend: str | None
    steps: int
    step_ids: list[int]
    step_time_us: dict[str, float | None]  # median, p90, max
    compute_us: float
    comm_us: float
    overlap_us: float
    overlap_pct: float | None  # None iff comm_us == 0
    exposed_comm_us: float
    exposed_comm_pct: float | None  # of step time (sum of step durations); None without steps
    idle_us: float
    memory_us: float
    backward_us: float
    comm_in_backward_us: float
    data_wait_us: float
    per_step: list[StepMetrics] = field(default_factory=list)


@dataclass(slots=True)
class UnitCollective:
    """One FSDP2 unit's collective at one step (analyses/fsdp_units.py; docs/metrics.md, "FSDP2 units")."""

    rank: int
    step: int | None
    unit: str  # the unit's module name as FSDP names it ("" for the root module: shown as "(root)")
    op: str  # all_gather, reduce_scatter, all_reduce (HSDP, across replicas)
    phase: str  # forward, backward
    prefetched: bool  # issued ahead, in another unit's prefetch (FSDP::forward_prefetch / backward_prefetch)
    synchronous: bool  # the main thread sat in FSDP's range until the collective ended (CPU: async_op=False)
    first: bool  # the step's first forward all-gather: nothing runs before it to hide it behind
    start_us: float
    dur_us: float
    exposed_us: float  # of dur_us, the part with no compute running on this rank
    bytes: int | None = None
    # all-gathers: this rank's compute from this all-gather's end to the end of the pass's next all-gather (the
    # compute a prefetched next all-gather could hide behind: analyses/fsdp_replay.py); None for the pass's last
    compute_after_us: float | None = None


@dataclass(slots=True)
class CollectiveCall:
    """One collective as it ran on one rank (GPU: the NCCL kernel; CPU: the gloo work on the gloo thread)."""

    rank: int
    index: int  # k-th collective of this rank (in start order)
    step: int | None
    op: str  # all_reduce, broadcast, all_gather, reduce_scatter, send_recv, barrier, ...
    group: str | None
    seq: int | None
    bytes: int | None
    start_us: float
    dur_us: float
    end_us: float
    start_rel_backward_us: float | None  # start - backward start of its step
    algbw_gbps: float | None  # bytes / dur, GB/s (1e9 bytes/s)
    busbw_gbps: float | None
    launch_us: float | None = None  # when the host enqueued it (CPU: the c10d call; GPU: the kernel launch)
    comms_id: str | None = None  # Kineto's cross-rank "Comms Id" where the profiler writes one (newer torch)


@dataclass(slots=True)
class Bucket:
    """One DDP gradient bucket all-reduce of one step (the all_reduce calls launched from backward)."""

    rank: int
    step: int
    index: int
    bytes: int | None
    start_us: float
    end_us: float
    dur_us: float
    is_last: bool
    after_backward_end_us: float  # max(0, end - backward end): communication left after backward


@dataclass(slots=True)
class GradReady:
    """A parameter's gradient became ready (end of its AccumulateGrad) at t_us."""

    rank: int
    step: int | None
    t_us: float
    bytes: int | None


@dataclass(slots=True)
class SyncCall:
    """A call that blocks the CPU until queued device work is done (cudaDeviceSynchronize, .item(), ...)."""

    rank: int
    step: int | None
    name: str
    t_us: float  # CPU clock (aligned); compare with StepMetrics.cpu_backward_*_us
    dur_us: float
    detail: str = ""

"""The JSON shapes of the performance sections (docs/json.md `analyze`), as TypedDicts: what a PerfSection holds,
fresh from an analysis (analyses/results.py to_sections) or loaded back from a saved report.json, and what the
renderers read. A saved report may come from an older ddpdoctor, so every key is optional and readers say "-"
for what is missing."""

from __future__ import annotations

from typing import TypedDict


class InputJson(TypedDict, total=False):
    """One trace file (or per-rank summary) the analysis read (rundir/summary_records.py InputInfo)."""

    path: str
    rank: int
    rank_source: str  # "distributedInfo" | "filename" | "order" | "summary"
    device: str  # "cpu" | "gpu"
    events: int


class StepTimeJson(TypedDict, total=False):
    """A rank's step time over its recorded steps ("min" only in a class row of renderers/rank_classes.py)."""

    median: float | None
    p90: float | None
    max: float | None
    min: float | None


class StepJson(TypedDict, total=False):
    """One recorded step of one rank (rundir/summary_records.py StepMetrics)."""

    step: int
    start_us: float
    dur_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    overlap_pct: float | None
    exposed_comm_us: float
    idle_us: float
    backward_start_us: float | None
    backward_end_us: float | None
    comm_in_backward_us: float
    data_wait_us: float
    cpu_backward_start_us: float | None
    cpu_backward_end_us: float | None
    backward_passes: int


class RankJson(TypedDict, total=False):
    """One entry of "ranks" (rundir/summary_records.py RankMetrics): totals over the rank's recorded steps."""

    rank: int | str  # str: a class of alike ranks in a grouped view, its ranks as ranges ("0-511,513-1023")
    world_size: int | None
    device: str | None
    backend: str | None
    steps: int | list[int] | None  # a list of step ids in reports saved by early versions
    step_ids: list[int]
    step_time_us: StepTimeJson
    compute_us: float | None
    comm_us: float | None
    overlap_us: float | None
    overlap_pct: float | None
    exposed_comm_us: float | None
    exposed_comm_pct: float | None
    idle_us: float | None
    memory_us: float | None
    backward_us: float | None
    comm_in_backward_us: float | None
    data_wait_us: float | None
    per_step: list[StepJson]


class OpTotalsJson(TypedDict):
    """One op of collectives.by_op: calls, bytes (null when no call of the op has a known size), time."""

    count: int
    bytes: int | None
    time_us: float


class CallJson(TypedDict, total=False):
    """One collective call on one rank (rundir/summary_records.py CollectiveCall)."""

    rank: int
    index: int
    step: int | None
    op: str
    group: str | None
    seq: int | None
    bytes: int | None
    start_us: float
    dur_us: float
    end_us: float
    start_rel_backward_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    launch_us: float | None
    comms_id: str  # only where the trace carries Kineto's "Comms Id" (docs/metrics.md#collective-matching)


class BucketJson(TypedDict, total=False):
    """One DDP gradient bucket all-reduce of one step (rundir/summary_records.py Bucket)."""

    rank: int
    step: int
    index: int
    bytes: int | None
    start_us: float
    end_us: float
    dur_us: float
    is_last: bool
    after_backward_end_us: float


class BandwidthJson(TypedDict, total=False):
    latency_us: float | None
    bytes_per_us: float | None
    points: int


class CollectivesJson(TypedDict, total=False):
    """The "collectives" object; grad_ready and matched are passed through to the HTML charts as they are."""

    count: int
    by_op: dict[str, OpTotalsJson]
    calls: list[CallJson]
    buckets: list[BucketJson]
    grad_ready: list[dict[str, object]]
    bandwidth: BandwidthJson
    matched: list[dict[str, object]]


class StragglerEvidenceJson(TypedDict, total=False):
    caused_wait_us: dict[str, float]
    last_arrival_count: dict[str, int]
    arrival_skew_median_us: float | None
    step_time_skew_us: float | None
    step_time_us_by_rank: dict[str, float | None]


class StragglersJson(TypedDict, total=False):
    """The "stragglers" object: the ranks the others wait for, and why (docs/metrics.md#caused-wait)."""

    ranks: list[int]
    evidence: StragglerEvidenceJson

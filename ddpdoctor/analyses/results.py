"""The result dataclasses of `analyze` (ANALYSIS_CONTRACT.md): what findings rules and renderers read.

All times are microseconds (floats). ``None`` means "not measurable" (e.g. overlap_pct of a rank with no
communication), never NaN. Timestamps in calls, buckets, grad_ready and per_step are on rank 0's clock
after clock alignment (``clock_offsets_us``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

# The per-rank records live with the run directory's schema (summary.json); analyses re-export them here.
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DDPModule, Parallelism
from ddpdoctor.rundir.summary_records import (
    Bucket,
    CollectiveCall,
    GradReady,
    InputInfo,
    RankMetrics,
    StepMetrics,
    SyncCall,
    UnitCollective,
    asdict,
)

__all__ = ["Analysis", "BandwidthFit", "Bucket", "CollectiveCall", "CommSplit", "DDPModuleEntry", "GradReady", "InputInfo",
           "MatchedCollective", "RankMetrics", "StepMetrics", "Stragglers", "SyncCall", "UnitCollective", "asdict"]


@dataclass
class BandwidthFit:
    """dur = latency_us + bytes / bytes_per_us, least squares over this run's collectives with bytes."""

    latency_us: float | None
    bytes_per_us: float | None
    points: int


@dataclass
class MatchedCollective:
    """The same collective on every rank that ran it."""

    key: str
    op: str
    group: str | None
    seq: int | None
    bytes: int | None
    starts_us: dict[int, float]
    ends_us: dict[int, float]
    arrival_skew_us: float  # lateness of the last rank by its own work (crossrank.match: at most latest - earliest start)
    last_rank: int  # the rank that arrived last by its own work
    lateness_us: dict[int, float] = field(default_factory=dict)  # each rank's own lateness (0: the earliest)


@dataclass
class CommSplit:
    """One rank's exposed communication (communication no compute hides) split in three (docs/metrics.md#exposed-split),
    totals over its recorded steps: ``wait_us`` waiting for a late peer (arrival skew), ``transfer_us`` the rest of
    the exposed time (the data moving), ``dispatch_us`` host dispatch (enqueued, not yet running, nothing else of
    this rank's communication running: outside the exposed time, shown beside it; CPU traces only). ``waiting_for_us``: the exposed
    wait by the rank whose arrival ended it. ``wait_by_step``: exposed wait per step (the rules' per-step figure)."""

    rank: int
    steps: int
    exposed_us: float
    wait_us: float
    transfer_us: float
    dispatch_us: float | None  # None on GPU traces (launch-to-start there is queueing on the stream)
    waiting_for_us: dict[int, float] = field(default_factory=dict)
    wait_by_step: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        n = max(1, self.steps)
        return {"rank": self.rank, "steps": self.steps, "exposed_ms_per_step": round(self.exposed_us / n / 1e3, 3),
                "wait_ms_per_step": round(self.wait_us / n / 1e3, 3),
                "transfer_ms_per_step": round(self.transfer_us / n / 1e3, 3),
                "dispatch_ms_per_step": None if self.dispatch_us is None else round(self.dispatch_us / n / 1e3, 3),
                "waiting_for_ms_per_step": {str(k): round(v / n / 1e3, 3) for k, v in sorted(self.waiting_for_us.items())}}


@dataclass
class Stragglers:
    ranks: list[int]
    caused_wait_us: dict[int, float]  # time the other ranks waited for this one (sum over matched collectives)
    last_arrival_count: dict[int, int]
    arrival_skew_median_us: float | None
    step_time_skew_us: float | None  # max - min of per-rank median step time
    step_time_us_by_rank: dict[int, float | None]
    # rank -> (collective kind, times it was last in that kind, collectives of that kind): the kind where the rank
    # makes the others wait most (docs/metrics.md#caused-wait); its majority is judged there, not over every kind.
    last_in_kind: dict[int, tuple[str, int, int]] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {
            "ranks": list(self.ranks),
            "evidence": {
                "caused_wait_us": {str(k): v for k, v in self.caused_wait_us.items()},
                "last_arrival_count": {str(k): v for k, v in self.last_arrival_count.items()},
                "arrival_skew_median_us": self.arrival_skew_median_us,
                "step_time_skew_us": self.step_time_skew_us,
                "step_time_us_by_rank": {str(k): v for k, v in self.step_time_us_by_rank.items()},
            },
        }


@dataclass(slots=True)
class OpTotals:
    """One op's collectives: how many, their bytes (None when no call has a known size), their time."""

    count: int = 0
    bytes: int | None = None
    time_us: float = 0.0


@dataclass
class DDPModuleEntry:
    """One DDP module of the lowest rank that reported them: a row of the "ddp" section (docs/json.md)."""

    rank: int
    module: int  # its index among the rank's DDP modules
    config: DDPModule  # configuration and bucket layout, as the run directory's manifest recorded them

    def to_json(self) -> JsonObject:
        return {"rank": self.rank, "module": self.module, **msgspec.to_builtins(self.config)}


@dataclass
class Analysis:
    """Everything `analyze` computed: pure data, JSON-ready through to_sections()."""

    inputs: list[InputInfo]
    window: str  # "all" | "hta"
    ranks: list[RankMetrics]
    calls: list[CollectiveCall] = field(default_factory=list)
    buckets: list[Bucket] = field(default_factory=list)
    grad_ready: list[GradReady] = field(default_factory=list)
    syncs: list[SyncCall] = field(default_factory=list)
    bandwidth: BandwidthFit = field(default_factory=lambda: BandwidthFit(None, None, 0))
    matched: list[MatchedCollective] = field(default_factory=list)
    stragglers: Stragglers | None = None
    clock_offsets_us: dict[int, float] = field(default_factory=dict)
    ddp: list[DDPModuleEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # rank -> (cores it could run on, ranks on its host), from a ddpdoctor run's manifest; absent for bare traces
    host_cpus: dict[int, tuple[int, int]] = field(default_factory=dict)
    # Exposed communication per rank split into waiting for a late peer, transfer and host dispatch (crossrank.py)
    comm_split: list[CommSplit] = field(default_factory=list)
    # FSDP2 units' collectives (analyses/fsdp_units.py) and what the job built (a ddpdoctor run's manifest)
    fsdp: list[UnitCollective] = field(default_factory=list)
    parallelism: Parallelism | None = None

    def by_op(self) -> dict[str, OpTotals]:
        """count, bytes (None when no call of the op has a known size) and total time per op."""
        out: dict[str, OpTotals] = {}
        for c in self.calls:
            row = out.setdefault(c.op, OpTotals())
            row.count += 1
            if c.bytes is not None:
                row.bytes = (row.bytes or 0) + c.bytes
            row.time_us += c.dur_us
        return out

    def to_sections(self) -> JsonObject:
        """The JSON sections of docs/json.md (everything except the envelope and findings)."""
        matched = []
        for m in self.matched:
            d = asdict(m)
            d["starts_us"] = {str(k): v for k, v in m.starts_us.items()}
            d["ends_us"] = {str(k): v for k, v in m.ends_us.items()}
            d["lateness_us"] = {str(k): v for k, v in m.lateness_us.items()}
            matched.append(d)
        return {
            "inputs": [asdict(i) for i in self.inputs],
            "window": self.window,
            "ranks": [asdict(r) for r in self.ranks],
            "collectives": {
                "count": len(self.calls),
                "by_op": {op: asdict(t) for op, t in self.by_op().items()},
                "calls": [_call_json(c) for c in self.calls],
                "buckets": [asdict(b) for b in self.buckets],
                "grad_ready": [asdict(g) for g in self.grad_ready],
                "bandwidth": asdict(self.bandwidth),
                "matched": matched,
            },
            "syncs": [asdict(s) for s in self.syncs],
            "stragglers": self.stragglers.to_json() if self.stragglers else {"ranks": [], "evidence": {}},
            "exposed_split": [c.to_json() for c in self.comm_split],
            "clock_offsets_us": {str(k): v for k, v in self.clock_offsets_us.items()},
            "ddp": [d.to_json() for d in self.ddp],
            **({"fsdp_units": self.fsdp_units()} if self.fsdp else {}),
        }

    def fsdp_units(self) -> JsonObject:
        """The FSDP2 unit inventory (docs/json.md "fsdp_units"): per unit, time and exposed time per step of
        each collective, with the unit's parameters where the run recorded them."""
        from ddpdoctor.analyses.fsdp_replay import replay_prefetch
        from ddpdoctor.analyses.fsdp_table import unit_table

        steps = max((r.steps for r in self.ranks), default=0)
        rows = unit_table(self.fsdp, steps)
        record = {u.fqn: u for u in self.parallelism.fsdp2_units} if self.parallelism else {}
        replay = replay_prefetch(self.fsdp)
        ranks = len({c.rank for c in self.fsdp}) or 1
        for row in rows:
            u = record.get(str(row["unit"]))
            if u is not None:
                row.update(params=u.numel, bytes=u.bytes, kind=u.kind, reshard_after_forward=u.reshard_after_forward)
            if replay.predictable:  # docs/metrics.md#fsdp2-prefetch-replay
                name = "" if row["unit"] == "(root)" else str(row["unit"])
                row["forward_prefetch_saved_ms"] = replay.unit_saved_ms(name, "forward", steps, ranks)
                row["backward_prefetch_saved_ms"] = replay.unit_saved_ms(name, "backward", steps, ranks)
        return {"units": rows, "steps": steps, "prefetch_replay": replay.to_json(steps, ranks)}


def _call_json(c: CollectiveCall) -> JsonObject:
    """A call as JSON; ``comms_id`` only where the trace carries Kineto's "Comms Id" (newer torch)."""
    d = asdict(c)
    if d.get("comms_id") is None:
        d.pop("comms_id", None)
    return d


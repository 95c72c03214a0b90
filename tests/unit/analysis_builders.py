"""Hand-built Analysis objects for the findings and what-if unit tests (numbers chosen to be worked out by hand)."""

from __future__ import annotations

from typing import Any

import msgspec

from ddpdoctor.analyses.results import (
    Analysis,
    BandwidthFit,
    Bucket,
    DDPModuleEntry,
    GradReady,
    RankMetrics,
    StepMetrics,
    Stragglers,
)
from ddpdoctor.rundir.schema import DDPModule


def step(n: int, *, start: float = 0.0, dur: float = 1000.0, comm: float = 0.0, exposed: float = 0.0,
         bw: tuple[float | None, float | None] = (None, None), data_wait: float = 0.0) -> StepMetrics:
    overlap = comm - exposed
    return StepMetrics(
        step=n, start_us=start, dur_us=dur, compute_us=dur - exposed, comm_us=comm, overlap_us=overlap,
        overlap_pct=100.0 * overlap / comm if comm else None, exposed_comm_us=exposed, idle_us=0.0,
        backward_start_us=bw[0], backward_end_us=bw[1], comm_in_backward_us=overlap, data_wait_us=data_wait,
    )


def rank(r: int, steps: list[StepMetrics], world_size: int = 2, **over: Any) -> RankMetrics:
    durs = sorted(s.dur_us for s in steps)
    total = sum(durs)
    comm = sum(s.comm_us for s in steps)
    exposed = sum(s.exposed_comm_us for s in steps)
    overlap = comm - exposed
    fields: dict[str, Any] = dict(
        rank=r, world_size=world_size, device="cpu", backend="gloo", steps=len(steps),
        step_ids=[s.step for s in steps],
        step_time_us={"median": durs[len(durs) // 2] if durs else None, "p90": durs[-1] if durs else None,
                      "max": durs[-1] if durs else None},
        compute_us=total - exposed, comm_us=comm, overlap_us=overlap,
        overlap_pct=100.0 * overlap / comm if comm else None, exposed_comm_us=exposed,
        exposed_comm_pct=100.0 * exposed / total if total else None, idle_us=0.0, memory_us=0.0,
        backward_us=0.0, comm_in_backward_us=overlap, data_wait_us=sum(s.data_wait_us for s in steps),
        per_step=steps,
    )
    fields.update(over)
    return RankMetrics(**fields)


def analysis(ranks: list[RankMetrics], **over: Any) -> Analysis:
    fields: dict[str, Any] = dict(inputs=[], window="all", ranks=ranks)
    fields.update(over)
    # DDP modules may be given as the manifest's JSON (a parameter's name may be left out)
    fields["ddp"] = [d if isinstance(d, DDPModuleEntry) else DDPModuleEntry(0, i, ddp_module(d))
                     for i, d in enumerate(fields.get("ddp") or [])]
    return Analysis(**fields)


def ddp_module(cfg: dict[str, Any]) -> DDPModule:
    """A DDP module's configuration as the manifest's JSON gives it."""
    params = [{"name": f"p{i}", **p} for i, p in enumerate(cfg.get("parameters") or [])]
    return msgspec.convert({**cfg, "parameters": params}, DDPModule)


def grads(r: int, s: int, items: list[tuple[float, int | None]]) -> list[GradReady]:
    return [GradReady(rank=r, step=s, t_us=t, bytes=b) for t, b in items]


def bucket(r: int, s: int, i: int, nbytes: int, start: float, end: float, is_last: bool = False,
           after: float = 0.0) -> Bucket:
    return Bucket(rank=r, step=s, index=i, bytes=nbytes, start_us=start, end_us=end, dur_us=end - start,
                  is_last=is_last, after_backward_end_us=after)


def fit(latency: float, rate: float, points: int = 10) -> BandwidthFit:
    return BandwidthFit(latency_us=latency, bytes_per_us=rate, points=points)


def stragglers(ranks: list[int], skew: float, waited: dict[int, float], steps_by_rank: dict[int, float]) -> Stragglers:
    return Stragglers(ranks=ranks, caused_wait_us=waited, last_arrival_count={k: 10 for k in ranks},
                      arrival_skew_median_us=skew, step_time_skew_us=None, step_time_us_by_rank=steps_by_rank)

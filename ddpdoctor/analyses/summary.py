"""Per-rank summary: one rank's traces reduced to its RankResult, JSON-ready (ranks/rankR/summary.json).

Each rank writes its own summary when its profiler stops, so `analyze` of a 1,000-rank job merges 1,000 small
files instead of re-reading 1,000 traces on one machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ddpdoctor.analyses.rank import RankResult, analyze_trace
from ddpdoctor.analyses.results import asdict
from ddpdoctor.errors import BadInput
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import RankSummary
from ddpdoctor.traces.loader import no_gc
from ddpdoctor.traces.split import load_trace
from ddpdoctor.traces.trace import Spans, Trace

# 2: FSDP's own record_function ranges are not compute (issue 37); a summary of schema 1 counted them as compute, so
# an FSDP2 rank's overlap read 100% and its exposed communication 0: `analyze` reads the trace again instead.
SCHEMA = 2


def _cat_spans(parts: list[Spans]) -> Spans:
    return Spans(*(np.concatenate([getattr(p, k) for p in parts]) for k in ("start", "end", "launch")))


def merge_traces(traces: list[Trace]) -> Trace:
    """Several traces of one rank (a profiler schedule with repeat > 1) as one trace with all their steps."""
    if len(traces) == 1:
        return traces[0]
    ids = [s[0] for t in traces for s in t.steps]
    if len(ids) != len(set(ids)):
        raise BadInput(f"two traces claim rank {traces[0].rank} with the same steps: "
                       + ", ".join(t.path for t in traces))
    t0 = traces[0]
    return Trace(
        path=",".join(t.path for t in traces), rank=t0.rank, rank_source=t0.rank_source,
        world_size=t0.world_size, backend=t0.backend, host=t0.host, device=t0.device,
        n_events=sum(t.n_events for t in traces), groups={k: v for t in traces for k, v in t.groups.items()},
        steps=sorted((s for t in traces for s in t.steps), key=lambda s: s[1]),
        compute=_cat_spans([t.compute for t in traces]),
        comm=sorted((c for t in traces for c in t.comm), key=lambda c: c.start),
        memory=_cat_spans([t.memory for t in traces]),
        backward=_cat_spans([t.backward for t in traces]),
        data_wait=_cat_spans([t.data_wait for t in traces]),
        enqueues=sorted((c for t in traces for c in t.enqueues), key=lambda c: c.start),
        grads=sorted((c for t in traces for c in t.grads), key=lambda c: c.end),
        syncs=sorted((c for t in traces for c in t.syncs), key=lambda c: c.start),
        fsdp=sorted((c for t in traces for c in t.fsdp), key=lambda c: c.start),
        notes=[n for t in traces for n in t.notes],
    )


def analyze_files(paths: list[Path], rank: int | None = None, window: str = "all", workers: int = 1) -> RankResult:
    """One rank's traces reduced; ``workers``: processes that may share one big trace's decoding."""
    with no_gc():  # one rank's trace: everything built here lives until the summary is made
        traces = [load_trace(Path(p), fallback_rank=rank, workers=workers) for p in paths]
        if rank is not None:
            for t in traces:
                if t.rank_source != "distributedInfo":
                    t.rank, t.rank_source = rank, "filename"
        return analyze_trace(merge_traces(traces), window)


def to_dict(r: RankResult) -> JsonObject:
    """summary.json's content (rundir/schema.py RankSummary)."""
    return {"schema": SCHEMA, "window": "all", **asdict(r)}


def from_summary(s: RankSummary) -> RankResult:
    """A validated summary.json (rundir.schema.RankSummary) as the RankResult it was written from."""
    return RankResult(input=s.input, metrics=s.metrics, calls=list(s.calls), buckets=list(s.buckets),
                      grad_ready=list(s.grad_ready), syncs=list(s.syncs), host=s.host, notes=list(s.notes),
                      fsdp=list(s.fsdp))


def summarize_trace_files(paths: list[Path], rank: int) -> JsonObject:
    """The bootstrap's entry point: this rank's traces -> summary.json content (window "all")."""
    return to_dict(analyze_files([Path(p) for p in paths], rank=rank))

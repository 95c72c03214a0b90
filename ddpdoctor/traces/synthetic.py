"""Synthetic jobs of any size built from recorded traces (ranks renamed, clocks shifted per node, steps repeated,
one rank made slow, ProfilerStep stripped): the input of the scaling tests and of benchmarks/analyze_scale.py.

Every event is a recorded one; only ranks, times and step numbers change, so what the analysis meets at 1,024 ranks
is what it meets at 2, as many times over."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import TypedDict, cast

from ddpdoctor import safe_io

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
RANKS_PER_NODE = 8


class TraceEvent(TypedDict, total=False):
    """A Chrome trace event as the profiler records it (the keys this module reads or moves; others ride along)."""

    ph: str
    name: str
    ts: float
    dur: float
    cat: str
    pid: int | str
    tid: int | str
    args: dict[str, object]


class PgConfig(TypedDict, total=False):
    pg_name: str
    pg_size: int
    ranks: list[int] | str  # "all" once a synthetic world is too large to list


class DistributedInfo(TypedDict, total=False):
    backend: str
    rank: int
    world_size: int
    pg_count: int
    pg_config: list[PgConfig]


class TraceDoc(TypedDict, total=False):
    """A profiler trace file's JSON object (the keys this module changes; the profiler's others are copied)."""

    traceEvents: list[TraceEvent]
    distributedInfo: DistributedInfo
    host_name: str


def load_doc(path: Path) -> TraceDoc:
    """A trace file (.json or .json.gz) as its JSON object."""
    doc = json.loads(safe_io.read_bytes(Path(path)))
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: not a profiler trace")
    return cast(TraceDoc, doc)  # checked above: an object with a list of events


def _span(events: list[TraceEvent]) -> tuple[float, float]:
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    t0 = min(float(e["ts"]) for e in xs)
    return t0, max(float(e["ts"]) + float(e.get("dur", 0)) for e in xs) - t0


def repeat_steps(doc: TraceDoc, copies: int) -> TraceDoc:
    """The trace with its events repeated ``copies`` times back to back in time, each copy's ProfilerSteps
    numbered after the previous copy's (a longer recording of the same job)."""
    events = doc["traceEvents"]
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    _, span = _span(body)
    span += 100.0
    nsteps = max((int(m.group(1)) for e in body if (m := _STEP.match(str(e.get("name", ""))))), default=0) + 1
    out = list(meta)
    for c in range(copies):
        for e in body:
            e2 = e.copy()
            if "ts" in e2:
                e2["ts"] = round(float(e2["ts"]) + c * span, 3)
            if (m := _STEP.match(str(e2.get("name", "")))) is not None:
                e2["name"] = f"ProfilerStep#{int(m.group(1)) + c * nsteps}"
            out.append(e2)
    return {**doc, "traceEvents": out}


def strip_steps(doc: TraceDoc) -> TraceDoc:
    """The trace as the profiler writes it without a schedule (or a serving framework does): no ProfilerStep#N."""
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if not _STEP.match(str(e.get("name", "")))]}


def as_rank(doc: TraceDoc, rank: int, world: int, shift_us: float = 0.0, late_us: float = 0.0,
            host: str | None = None) -> TraceDoc:
    """``doc`` as rank ``rank`` of ``world``: distributedInfo and process group renamed, every timestamp moved by
    ``shift_us`` (another host's clock), and with ``late_us`` > 0 every collective this rank runs starts that much
    later and ends when it did (the others no longer wait for it: it arrives last, a straggler)."""
    out = cast(TraceDoc, {k: copy.deepcopy(v) for k, v in doc.items() if k != "traceEvents"})
    dist = out.setdefault("distributedInfo", {})
    dist["rank"], dist["world_size"] = rank, world
    for pg in dist.get("pg_config") or []:
        pg["pg_size"], pg["ranks"] = world, list(range(world)) if world <= 64 else "all"
    if host is not None:
        out["host_name"] = host
    events: list[TraceEvent] = []
    for e in doc["traceEvents"]:
        e2 = e.copy()
        if "ts" in e2 and e2.get("ph") != "M":
            e2["ts"] = float(e2["ts"]) + shift_us
            if late_us and e2.get("ph") == "X" and str(e2.get("name", "")).startswith(("gloo:", "nccl")):
                late = min(late_us, float(e2.get("dur", 0.0)))
                e2["ts"] += late
                e2["dur"] = float(e2.get("dur", 0.0)) - late
        events.append(e2)
    out["traceEvents"] = events
    return out


def write(doc: TraceDoc, path: Path, level: int = 1) -> Path:
    """``doc`` as a .json.gz (or .json) trace file."""
    # The profiler's own spacing ('"rank": 3'): HTA finds a file's rank with that regular expression, and reads
    # every compact file as rank 0.
    data = json.dumps(doc).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, compresslevel=level) if path.name.endswith(".gz") else data)
    return path


def write_job(sources: list[TraceDoc], ranks: int, dest: Path, slow_rank: int | None = None,
              late_us: float = 0.0, node_shift_us: float = 1000.0) -> list[Path]:
    """``ranks`` trace files under ``dest`` (rankR.pt.trace.json.gz), rank r from ``sources[r % len(sources)]``,
    RANKS_PER_NODE ranks per host (one clock each, shifted by node_shift_us per node), ``slow_rank`` late."""
    paths = []
    for r in range(ranks):
        node = r // RANKS_PER_NODE
        d = as_rank(sources[r % len(sources)], r, ranks, shift_us=node * node_shift_us,
                    late_us=late_us if r == slow_rank else 0.0, host=f"node{node}")
        paths.append(write(d, dest / f"rank{r}.pt.trace.json.gz"))
    return paths

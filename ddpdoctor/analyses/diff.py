"""`diff`: two analysed runs -> where the step time changed (docs/diff.md): the step, its parts, ranks, collectives
by kind and size class, DDP buckets, each change with a bootstrap interval and a noise floor. Pure."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpdoctor.analyses.collectives import BUS_FACTOR
from ddpdoctor.analyses.diff_changes import ConfigChange
from ddpdoctor.analyses.diff_ops import OpDelta
from ddpdoctor.analyses.diff_stats import MIN_EFFECT_PCT, MIN_EFFECT_US, Delta, delta
from ddpdoctor.analyses.intervals import MIN_SAMPLES
from ddpdoctor.analyses.results import Analysis, StepMetrics
from ddpdoctor.analyses.whatif import ddp_config
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.schema import DDPModule

# The step's wall time split two ways (each sums to the step): by what ran, and by phase of the step.
RESOURCES = ("compute", "exposed_comm", "data_wait", "idle")
PHASES = ("data", "forward", "backward", "optimizer")
# Exposed communication split into waiting for a late peer and transfer (issue 28's ledger split,
# docs/metrics.md#exposed-split): comm_wait = the rank's exposed wait in the step (Analysis.comm_split[].wait_by_step),
# comm_transfer = exposed_comm - comm_wait. Filled only when the analysis carries the split; absent otherwise, never 0.
COMM_SPLIT = ("comm_wait", "comm_transfer")
# Collective size classes (bytes per call): latency-bound, middle, bandwidth-bound.
SIZE_CLASSES = ((4 << 10, "<4KiB"), (256 << 10, "4KiB-256KiB"), (16 << 20, "256KiB-16MiB"), (None, ">=16MiB"))


def size_class(nbytes: int | None) -> str:
    if nbytes is None:
        return "unknown"
    for limit, name in SIZE_CLASSES:
        if limit is None or nbytes < limit:
            return name
    return SIZE_CLASSES[-1][1]


@dataclass(frozen=True)
class StepParts:
    """One step of one rank, µs. Resources: data_wait; idle = idle - data_wait (at least 0); exposed_comm; compute =
    dur - exposed_comm - data_wait - idle (at least 0): every other busy moment, compute and memory work. Phases
    (CPU clock): data; forward = from the step start to backward, less data; backward = the synced backward window;
    optimizer = after backward to the step end (the optimizer and the communication tail). None: no backward."""

    step: int
    dur_us: float
    parts: dict[str, float | None]


def step_parts(s: StepMetrics, wait_us: float | None = None) -> StepParts:
    """``wait_us``: the step's exposed wait for a late peer where the analysis split exposed communication."""
    data = max(0.0, min(s.data_wait_us, s.dur_us))
    exposed = max(0.0, s.exposed_comm_us)
    # Waiting for a batch is mostly idle in the trace (nothing runs on the training thread while the loader waits):
    # it is counted once, as data wait, and idle is what is left outside it.
    idle = max(0.0, s.idle_us - data)
    parts: dict[str, float | None] = {
        "compute": max(0.0, s.dur_us - exposed - data - idle), "exposed_comm": exposed, "data_wait": data,
        "idle": idle}
    bs = s.cpu_backward_start_us if s.cpu_backward_start_us is not None else s.backward_start_us
    be = s.cpu_backward_end_us if s.cpu_backward_end_us is not None else s.backward_end_us
    end = s.start_us + s.dur_us
    if bs is not None and be is not None and s.start_us <= bs <= be <= end:
        backward, optimizer = be - bs, end - be
        parts.update(data=data, forward=max(0.0, s.dur_us - data - backward - optimizer), backward=backward,
                     optimizer=optimizer)
    else:
        parts.update(data=data, forward=None, backward=None, optimizer=None)
    wait = None if wait_us is None else min(max(0.0, float(wait_us)), exposed)
    parts["comm_wait"] = wait
    parts["comm_transfer"] = None if wait is None else exposed - wait
    return StepParts(s.step, s.dur_us, parts)


@dataclass(frozen=True)
class ComponentDelta:
    component: str
    kind: str  # "resource" | "phase" | "comm_split"
    rank: int | None  # None: the job (each step's mean over ranks)
    delta: Delta


@dataclass(frozen=True)
class Contributor:
    """A part of the step that changed beyond noise: the ranks where it did, and its largest change."""

    component: str
    kind: str
    ranks: list[int]
    rank: int  # the rank with the largest change
    delta: Delta
    waiting_for: list[int] = field(default_factory=list)  # exposed comm grown while these ranks made others wait

    def to_json(self) -> JsonObject:
        return {"component": self.component, "kind": self.kind, "ranks": self.ranks, "rank": self.rank,
                **self.delta.to_json(), "waiting_for": self.waiting_for}


@dataclass(frozen=True)
class CollectiveDelta:
    op: str
    size_class: str
    base_calls_per_step: float
    new_calls_per_step: float
    time: Delta  # time per step per rank in calls of this kind and class
    base_busbw_gbps: float | None
    new_busbw_gbps: float | None


@dataclass(frozen=True)
class BucketRow:
    index: int
    base_bytes: int | None
    new_bytes: int | None
    base_dur_us: float | None
    new_dur_us: float | None
    base_busbw_gbps: float | None
    new_busbw_gbps: float | None


@dataclass(frozen=True)
class BucketDiff:
    base_cap_mb: float | None
    new_cap_mb: float | None
    base_layout_bytes: list[int]  # bytes per bucket as DDP built them (manifest), empty when not recorded
    new_layout_bytes: list[int]
    layout_changed: bool
    rows: list[BucketRow]


@dataclass
class RunDiff:
    """Everything `diff` computed (the JSON section "diff", docs/json.md)."""

    base: str
    new: str
    world_size: int
    base_steps: int
    new_steps: int
    min_effect_us: float
    step: Delta
    by_rank: dict[int, Delta]
    components: list[ComponentDelta]
    contributors: list[Contributor]
    collectives: list[CollectiveDelta]
    buckets: BucketDiff | None
    changes: list[ConfigChange]
    composition: dict[str, dict[str, float]]  # side -> part -> mean µs per step (job), for the charts
    caused_wait_us: dict[str, dict[int, float]]  # side -> rank -> wait it caused the others, per step
    comm_split: bool  # whether exposed communication could be split into wait and transfer
    notes: list[str] = field(default_factory=list)
    operators: list[OpDelta] = field(default_factory=list)  # analyses/diff_ops.py, on the contributors' ranks

    def to_json(self) -> JsonObject:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "base": self.base, "new": self.new, "world_size": self.world_size,
            "steps": {"base": self.base_steps, "new": self.new_steps},
            "min_effect_ms": round(self.min_effect_us / 1e3, 3),
            "step": self.step.to_json(),
            "by_rank": {str(k): v.to_json() for k, v in sorted(self.by_rank.items())},
            "contributors": [c.to_json() for c in self.contributors],
            "components": [{"component": c.component, "kind": c.kind, "rank": c.rank, **c.delta.to_json()}
                           for c in self.components],
            "collectives": [{"op": c.op, "size_class": c.size_class,
                             "calls_per_step": {"base": r(c.base_calls_per_step), "new": r(c.new_calls_per_step)},
                             **c.time.to_json(), "busbw_gbps": {"base": r(c.base_busbw_gbps),
                                                                "new": r(c.new_busbw_gbps)}}
                            for c in self.collectives],
            "buckets": None if self.buckets is None else {
                "bucket_cap_mb": {"base": self.buckets.base_cap_mb, "new": self.buckets.new_cap_mb},
                "layout_bytes": {"base": self.buckets.base_layout_bytes, "new": self.buckets.new_layout_bytes},
                "layout_changed": self.buckets.layout_changed,
                "rows": [{"index": b.index, "bytes": {"base": b.base_bytes, "new": b.new_bytes},
                          "dur_ms": {"base": r(None if b.base_dur_us is None else b.base_dur_us / 1e3),
                                     "new": r(None if b.new_dur_us is None else b.new_dur_us / 1e3)},
                          "busbw_gbps": {"base": r(b.base_busbw_gbps), "new": r(b.new_busbw_gbps)}}
                         for b in self.buckets.rows]},
            "changes": [c.to_json() for c in self.changes],
            "composition_ms": {side: {k: round(v / 1e3, 3) for k, v in parts.items()}
                               for side, parts in self.composition.items()},
            "caused_wait_ms_per_step": {side: {str(k): round(v / 1e3, 3) for k, v in sorted(w.items())}
                                        for side, w in self.caused_wait_us.items()},
            "comm_split": self.comm_split,
            "operators": [o.to_json() for o in self.operators],
            "notes": list(self.notes),
        }


# ---- per side ---------------------------------------------------------------------------------------------------

Samples = dict[int, list[StepParts]]  # rank -> its steps


def _waits(a: Analysis) -> dict[int, dict[int, float]]:
    """rank -> step -> exposed wait, from the analysis's exposed-communication split where it has one (issue 28)."""
    split = getattr(a, "comm_split", None) or []
    return {int(c.rank): {int(k): float(v) for k, v in (c.wait_by_step or {}).items()} for c in split}


def _samples(a: Analysis) -> Samples:
    waits = _waits(a)
    return {r.rank: [step_parts(s, waits[r.rank].get(s.step, 0.0) if r.rank in waits else None) for s in r.per_step]
            for r in a.ranks if r.per_step}


def _job_steps(s: Samples) -> list[StepParts]:
    """Each step id's mean over the ranks that recorded it: the job's step (ranks of a DDP step finish together)."""
    by_step: dict[int, list[StepParts]] = defaultdict(list)
    for steps in s.values():
        for p in steps:
            by_step[p.step].append(p)
    out = []
    for sid in sorted(by_step):
        ps = by_step[sid]
        parts: dict[str, float | None] = {}
        for k in ps[0].parts:
            vals = [p.parts[k] for p in ps]
            parts[k] = None if any(v is None for v in vals) else statistics.fmean(v for v in vals if v is not None)
        out.append(StepParts(sid, statistics.fmean(p.dur_us for p in ps), parts))
    return out


def _values(steps: Iterable[StepParts], key: str) -> list[float]:
    if key == "step":
        return [p.dur_us for p in steps]
    return [v for p in steps if (v := p.parts.get(key)) is not None]


def _kind(component: str) -> str:
    return "resource" if component in RESOURCES else "phase" if component in PHASES else "comm_split"


def _caused_wait(a: Analysis) -> dict[int, float]:
    if a.stragglers is None:
        return {}
    steps = max((r.steps for r in a.ranks), default=0) or 1
    return {rank: w / steps for rank, w in a.stragglers.caused_wait_us.items()}


# ---- collectives and buckets -------------------------------------------------------------------------------------

def _collective_samples(a: Analysis, step_ids: list[int]) -> dict[tuple[str, str], tuple[list[float], float, list[float]]]:
    """(op, size class) -> (time per step per rank for each step, calls per step per rank, busbw values)."""
    nranks = max(1, len(a.ranks))
    time: dict[tuple[str, str], dict[int, float]] = defaultdict(lambda: defaultdict(float))
    count: dict[tuple[str, str], int] = defaultdict(int)
    busbw: dict[tuple[str, str], list[float]] = defaultdict(list)
    wanted = set(step_ids)
    for c in a.calls:
        if c.step not in wanted:
            continue
        key = (c.op, size_class(c.bytes))
        time[key][c.step] += c.dur_us / nranks
        count[key] += 1
        if c.busbw_gbps is not None:
            busbw[key].append(c.busbw_gbps)
    n = max(1, len(step_ids))
    return {k: ([v.get(s, 0.0) for s in step_ids], count[k] / n / nranks, busbw[k]) for k, v in time.items()}


def _collectives(base: Analysis, new: Analysis, bsteps: list[int], nsteps: list[int], step_us: float,
                 floor: float) -> list[CollectiveDelta]:
    b, n = _collective_samples(base, bsteps), _collective_samples(new, nsteps)
    out = []
    for key in sorted(set(b) | set(n)):
        bt, bc, bb = b.get(key, ([0.0] * len(bsteps), 0.0, []))
        nt, nc, nb = n.get(key, ([0.0] * len(nsteps), 0.0, []))
        d = delta(bt, nt, step_us, floor)
        if d is not None:
            out.append(CollectiveDelta(key[0], key[1], bc, nc, d, statistics.median(bb) if bb else None,
                                       statistics.median(nb) if nb else None))
    return sorted(out, key=lambda c: -abs(c.time.change.value))


def _layout(a: Analysis) -> tuple[float | None, list[int]]:
    cfg = ddp_config(a) or DDPModule()
    sizes = [int(b.bytes or 0) for b in cfg.buckets]
    return (float(cfg.bucket_cap_mb) if cfg.bucket_cap_mb is not None else None), sizes


def _bucket_rows(a: Analysis) -> dict[int, tuple[int | None, float, float | None]]:
    """bucket index -> (bytes, mean duration, busbw) over the recorded steps and ranks."""
    world = max(1, len(a.ranks))
    durs: dict[int, list[float]] = defaultdict(list)
    sizes: dict[int, list[int]] = defaultdict(list)
    for bk in a.buckets:
        durs[bk.index].append(bk.dur_us)
        if bk.bytes is not None:
            sizes[bk.index].append(bk.bytes)
    out: dict[int, tuple[int | None, float, float | None]] = {}
    for i, ds in durs.items():
        nbytes = int(statistics.median(sizes[i])) if sizes[i] else None
        dur = statistics.fmean(ds)
        bw = nbytes / dur / 1e3 * BUS_FACTOR["all_reduce"](world) if nbytes and dur > 0 and world > 1 else None
        out[i] = (nbytes, dur, bw)
    return out


def _buckets(base: Analysis, new: Analysis) -> BucketDiff | None:
    (bcap, blay), (ncap, nlay) = _layout(base), _layout(new)
    brows, nrows = _bucket_rows(base), _bucket_rows(new)
    if not (blay or nlay or brows or nrows):
        return None
    rows = []
    for i in sorted(set(brows) | set(nrows)):
        bb, bd, bw = brows.get(i, (None, None, None))
        nb, nd, nw = nrows.get(i, (None, None, None))
        rows.append(BucketRow(i, bb, nb, bd, nd, bw, nw))
    recorded = [b for b, _, _ in brows.values()], [b for b, _, _ in nrows.values()]
    changed = blay != nlay if (blay and nlay) else (len(brows) != len(nrows) or recorded[0] != recorded[1])
    return BucketDiff(bcap, ncap, blay, nlay, changed, rows)


# ---- the diff ----------------------------------------------------------------------------------------------------

def _contributors(components: list[ComponentDelta], waits: dict[str, dict[int, float]],
                  floor: float) -> list[Contributor]:
    by_comp: dict[tuple[str, str], list[ComponentDelta]] = defaultdict(list)
    for c in components:
        # the "data" phase is the data_wait resource again: named once
        if c.rank is not None and c.delta.significant and c.component != "data":
            by_comp[(c.component, c.kind)].append(c)
    grown_wait = sorted(r for r, w in waits["new"].items() if w - waits["base"].get(r, 0.0) >= floor)
    out = []
    for (comp, kind), rows in by_comp.items():
        top = max(rows, key=lambda c: abs(c.delta.change.value))
        same_sign = [c.rank for c in rows if c.rank is not None and
                     (c.delta.change.value > 0) == (top.delta.change.value > 0)]
        waiting = [r for r in grown_wait if r not in same_sign] if comp in ("exposed_comm", "comm_wait") else []
        out.append(Contributor(comp, kind, sorted(same_sign), int(top.rank or 0), top.delta, waiting))
    # What ran differently comes before the phases it happened in (the same time seen again); in each, the ranks the
    # others now wait for come first (the cause before the waiting it makes), then the largest change.
    order = {"resource": 0, "comm_split": 1, "phase": 2}  # the split refines exposed_comm; phases repeat the time
    return sorted(out, key=lambda c: (order.get(c.kind, 3), not set(c.ranks) & set(grown_wait),
                                      -abs(c.delta.change.value)))


def diff(base: Analysis, new: Analysis, changes: list[ConfigChange] | None = None,
         labels: tuple[str, str] = ("base", "new")) -> RunDiff:
    """The diff of two analysed runs of the same world size (the caller checks it: bad input otherwise)."""
    bs, ns = _samples(base), _samples(new)
    bjob, njob = _job_steps(bs), _job_steps(ns)
    notes: list[str] = []
    base_step = statistics.fmean(p.dur_us for p in bjob) if bjob else 0.0
    floor = max(MIN_EFFECT_US, MIN_EFFECT_PCT / 100.0 * base_step)
    step = delta(_values(bjob, "step"), _values(njob, "step"), base_step, floor)
    if step is None:
        raise ValueError("a side has no recorded steps")
    if min(len(bjob), len(njob)) < MIN_SAMPLES:
        notes.append(f"{min(len(bjob), len(njob))} step(s) on one side: no change can be told from noise; "
                     f"record at least {MIN_SAMPLES} (`ddpdoctor profile --active 10`)")
    split = any(p.parts.get("comm_wait") is not None for steps in (*bs.values(), *ns.values()) for p in steps)
    names = [*RESOURCES, *PHASES, *(COMM_SPLIT if split else ())]
    components: list[ComponentDelta] = []
    for comp in names:
        d = delta(_values(bjob, comp), _values(njob, comp), base_step, floor)
        if d is not None:
            components.append(ComponentDelta(comp, _kind(comp), None, d))
        for rank in sorted(set(bs) & set(ns)):
            d = delta(_values(bs[rank], comp), _values(ns[rank], comp), base_step, floor)
            if d is not None:
                components.append(ComponentDelta(comp, _kind(comp), rank, d))
    by_rank = {rank: d for rank in sorted(set(bs) & set(ns))
               if (d := delta(_values(bs[rank], "step"), _values(ns[rank], "step"), base_step, floor)) is not None}
    if not split:
        notes.append("exposed communication is not split into waiting for a peer and transfer in these runs; "
                     "caused_wait_ms_per_step says which rank the others waited for")
    waits = {"base": _caused_wait(base), "new": _caused_wait(new)}
    composition = {side: {k: statistics.fmean(_values(job, k)) if _values(job, k) else 0.0
                          for k in ("step", *RESOURCES, *PHASES)} for side, job in (("base", bjob), ("new", njob))}
    return RunDiff(
        base=labels[0], new=labels[1], world_size=len(bs), base_steps=len(bjob), new_steps=len(njob),
        min_effect_us=floor, step=step, by_rank=by_rank, components=components,
        contributors=_contributors(components, waits, floor),
        collectives=_collectives(base, new, [p.step for p in bjob], [p.step for p in njob], base_step, floor),
        buckets=_buckets(base, new), changes=list(changes or []), composition=composition, caused_wait_us=waits,
        comm_split=split, notes=notes)

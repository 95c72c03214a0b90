"""`diff`'s operators: self time per operator and step on one rank's trace, and the operators whose time changed beyond
noise by enough to matter to the step (HTA's trace_diff, held to the step's minimum effect; docs/diff.md). Pure."""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ddpdoctor.analyses.diff_stats import Delta, delta
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.traces.loader import RawTrace, complete_events

# Operators named in a diff: the largest changes among those that count.
TOP_OPS = 5
# Kernel names can be kilobytes of template arguments: shown cut here (the key stays whole).
MAX_NAME = 160
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATS = ("cpu_op", "user_annotation")


@dataclass(frozen=True)
class OpSteps:
    """One rank's operators: "cpu:NAME" / "gpu:NAME" -> step -> self time µs, and the steps recorded."""

    rank: int
    steps: list[int]
    per_step: dict[str, dict[int, float]]


def op_steps(raw: RawTrace, rank: int) -> OpSteps:
    """Self time (an operator's duration less its children's on the same thread) of CPU operators, and the duration
    of GPU kernels and copies, summed per name and ProfilerStep (by start time; a kernel that starts after its step's
    end counts in the next one). Sorting per thread: O(n log n)."""
    xs = complete_events(raw.events)
    steps = sorted((ev.ts, ev.ts + ev.dur, int(ev.name.split("#", 1)[1])) for ev in xs
                   if ev.name.startswith("ProfilerStep#") and ev.name.split("#", 1)[1].isdigit())
    starts = [s[0] for s in steps]
    per_step: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))

    def step_of(t: float) -> int | None:
        i = bisect.bisect_right(starts, t) - 1
        return steps[i][2] if i >= 0 and (t < steps[i][1] or i == len(steps) - 1) else None

    threads: dict[tuple[Any, Any], list[tuple[float, float, str]]] = defaultdict(list)
    for ev in xs:
        if ev.name.startswith("ProfilerStep#"):
            continue
        if ev.cat in GPU_CATS:
            s = step_of(ev.ts)
            if s is not None:
                per_step[f"gpu:{ev.name}"][s] += ev.dur
        elif ev.cat in CPU_CATS:
            threads[(ev.pid, ev.tid)].append((ev.ts, ev.dur, ev.name))
    for evs in threads.values():
        evs.sort(key=lambda e: (e[0], -e[1]))
        stack: list[list[Any]] = []  # [end, name, start, children's time]

        def close(item: list[Any]) -> None:
            s = step_of(item[2])
            if s is not None:
                per_step[f"cpu:{item[1]}"][s] += max(0.0, item[0] - item[2] - item[3])

        for ts, dur, name in evs:
            while stack and stack[-1][0] <= ts:
                close(stack.pop())
            if stack:
                stack[-1][3] += dur
            stack.append([ts + dur, name, ts, 0.0])
        while stack:
            close(stack.pop())
    return OpSteps(rank, [s[2] for s in steps], {k: dict(v) for k, v in per_step.items()})


@dataclass(frozen=True)
class OpDelta:
    name: str
    kind: str  # "cpu" | "gpu"
    rank: int
    delta: Delta

    def to_json(self) -> JsonObject:
        return {"name": self.name[:MAX_NAME], "kind": self.kind, "rank": self.rank, **self.delta.to_json()}


def op_deltas(base: list[OpSteps], new: list[OpSteps], base_step_us: float, floor_us: float) -> list[OpDelta]:
    """Per rank present on both sides, every operator's self time per step compared like a part of the step; the
    TOP_OPS largest that are significant (interval off zero, at least the step's minimum effect and 2 standard
    deviations of the operator's own steps)."""
    out = []
    new_by_rank = {o.rank: o for o in new}
    for b in base:
        n = new_by_rank.get(b.rank)
        if n is None or not b.steps or not n.steps:
            continue
        for key in set(b.per_step) | set(n.per_step):
            bs, ns = b.per_step.get(key, {}), n.per_step.get(key, {})
            if max(sum(bs.values()) / len(b.steps), sum(ns.values()) / len(n.steps)) < floor_us:
                continue  # an operator smaller than the minimum effect cannot change by as much
            d = delta([bs.get(s, 0.0) for s in b.steps], [ns.get(s, 0.0) for s in n.steps], base_step_us, floor_us)
            if d is not None and d.significant:
                kind, name = key.split(":", 1)
                out.append(OpDelta(name, kind, b.rank, d))
    return sorted(out, key=lambda o: -abs(o.delta.change.value))[:TOP_OPS]

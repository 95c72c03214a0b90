"""FSDP2's communication groups: each collective of one rank attributed to the unit (`fully_shard` module) whose
hook issued it, with its phase, whether it was prefetched, whether the main thread waited it out, and its exposed
time (docs/metrics.md, "FSDP2 units"). Pure: a Trace in, UnitCollective rows out.

A DDP bucket and an FSDP unit are two kinds of one communication group (a group of parameters whose collectives run
at a point of the step); this is the FSDP recogniser, read from FSDP2's own `record_function` ranges:
``FSDP::all_gather (fqn)`` holds a unit's all-gather, inside ``FSDP::pre_forward (fqn)`` / ``FSDP::pre_backward
(fqn)`` when the unit asked for it itself and inside ``FSDP::forward_prefetch for fqn`` / ``FSDP::backward_prefetch
for fqn`` when an earlier unit prefetched it; ``FSDP::post_backward_reduce (fqn)`` holds its reduce-scatter and,
under HSDP, the all-reduce across replicas that follows it."""

from __future__ import annotations

import bisect
import re

from ddpdoctor.analyses.collectives import _enqueue_launches, args_bytes, op_name, step_of
from ddpdoctor.analyses.fsdp_table import late_peer, unit_table  # noqa: F401 - the unit table, beside the rows
from ddpdoctor.rundir.summary_records import UnitCollective
from ddpdoctor.traces import intervals as iv
from ddpdoctor.traces.scan import CpuCall
from ddpdoctor.traces.trace import Trace

_FQN = re.compile(r"^FSDP::(?P<what>[a-z_]+)(?: \((?P<fqn>.*)\))?$")
_PREFETCH = re.compile(r"^FSDP::(?P<pass>forward|backward)_prefetch for (?P<fqn>.*)$")
MAX_NESTING = 64  # FSDP's ranges nest a few deep; the walk back to the enclosing ones is bounded


def _parse(name: str) -> tuple[str, str]:
    """(what, unit) of an FSDP range: ("all_gather", "layers.0"), ("forward_prefetch", "layers.1"), ..."""
    m = _PREFETCH.match(name)
    if m:
        return f"{m.group('pass')}_prefetch", m.group("fqn")
    m = _FQN.match(name)
    if m:
        return m.group("what"), m.group("fqn") or ""
    return name, ""


def _enclosing(ranges: list[CpuCall], starts: list[float], t: float) -> list[tuple[str, str, CpuCall]]:
    """The FSDP ranges that hold time ``t``, innermost first, parsed."""
    out: list[tuple[str, str, CpuCall]] = []
    i = bisect.bisect_right(starts, t) - 1
    seen = 0
    while i >= 0 and seen < MAX_NESTING:
        r = ranges[i]
        if r.start <= t <= r.end:
            what, unit = _parse(r.name)
            out.append((what, unit, r))
        i -= 1
        seen += 1
    return out


def unit_collectives(trace: Trace) -> list[UnitCollective]:
    """Every collective issued from inside one of FSDP2's ranges, attributed (none when the trace has none)."""
    ranges = trace.fsdp
    if not ranges or not trace.comm:
        return []
    starts = [r.start for r in ranges]
    if trace.device == "cpu":
        paired = _enqueue_launches(trace.comm, trace.enqueues)
        issue = [e.start if e is not None else c.start for c, e in zip(trace.comm, paired, strict=True)]
    else:
        issue = [c.launch if c.launch == c.launch else c.start for c in trace.comm]
    comp = trace.compute.pair()
    merged = iv.merge(*comp)
    out: list[UnitCollective] = []
    reduces_seen: dict[int, int] = {}  # id of a post_backward_reduce range -> collectives seen in it
    first_forward_done: set[int | None] = set()
    for c, t in sorted(zip(trace.comm, issue, strict=True), key=lambda ct: ct[1]):
        chain = _enclosing(ranges, starts, t)
        if not chain:
            continue
        names = [w for w, _, _ in chain]
        op = op_name(c.args.collective or c.name)
        if "all_gather" in names:
            k = names.index("all_gather")
            unit = chain[k][1]
            holder = chain[k][2]
            outer = names[k + 1:]
            phase = "backward" if any(w in ("pre_backward", "backward_prefetch") for w in outer) else "forward"
            prefetched = any(w.endswith("_prefetch") for w in outer)
            kind = "all_gather"
        elif "post_backward_reduce" in names:
            k = names.index("post_backward_reduce")
            unit, holder = chain[k][1], chain[k][2]
            n = reduces_seen.get(id(holder), 0)
            reduces_seen[id(holder)] = n + 1
            # gloo runs a reduce-scatter as gloo:all_reduce: the first of the range is the reduce-scatter, the
            # next (HSDP) the all-reduce across replicas
            kind = "reduce_scatter" if op == "reduce_scatter" or n == 0 else "all_reduce"
            phase, prefetched = "backward", False
        else:
            continue
        step = step_of(t, trace.steps)
        dur = c.end - c.start
        covered = iv.clipped_len(merged[0], merged[1], c.start, c.end) if len(merged[0]) else 0.0
        first = kind == "all_gather" and phase == "forward" and step not in first_forward_done
        if first:
            first_forward_done.add(step)
        out.append(UnitCollective(
            rank=trace.rank, step=step, unit=unit, op=kind, phase=phase, prefetched=prefetched,
            synchronous=holder.end >= c.end, first=first, start_us=c.start, dur_us=dur,
            exposed_us=max(0.0, dur - covered), bytes=args_bytes(c.args),
        ))
    _compute_after(out, merged)
    return out


def _compute_after(rows: list[UnitCollective], merged: tuple[iv.Arr, iv.Arr]) -> None:
    """Each all-gather's ``compute_after_us``: the rank's compute from its end to the end of the next all-gather of
    the same step and pass (the previous unit's compute, which that all-gather could run beside when prefetched)."""
    seqs: dict[tuple[int | None, str], list[UnitCollective]] = {}
    for r in rows:
        if r.op == "all_gather":
            seqs.setdefault((r.step, r.phase), []).append(r)
    for seq in seqs.values():
        for a, b in zip(seq, seq[1:], strict=False):
            end_a, end_b = a.start_us + a.dur_us, b.start_us + b.dur_us
            a.compute_after_us = (iv.clipped_len(merged[0], merged[1], end_a, end_b)
                                  if len(merged[0]) and end_b > end_a else 0.0)

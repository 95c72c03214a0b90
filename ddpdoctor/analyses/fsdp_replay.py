"""FSDP2's all-gather schedule replayed per unit (pure): what one-deep prefetch (`set_modules_to_forward_prefetch` /
`set_modules_to_backward_prefetch`) would save of each unit's exposed all-gather, from the run's own all-gather and
compute times (docs/metrics.md#fsdp2-prefetch-replay).

One pass (a step's forward, or its backward) of one rank is replayed on two lanes, FSDP2's all-gather stream and
the compute stream: unit k's compute starts once its all-gather and the previous unit's compute have ended; an
all-gather starts once it is issued and the previous all-gather has ended. Issued on demand, unit k's all-gather
starts when the previous unit's compute ends; prefetched, when the previous unit's compute starts. The run's own
schedule (each all-gather issued as it was: prefetched or on demand) against every one prefetched gives the time
each unit's compute waited less, at most the all-gather's measured exposed time. Not replayed: the reduce-scatters' stream and its contention with the
all-gathers, the CPU thread running ahead of the GPU, memory limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.summary_records import UnitCollective

CANNOT_SYNC = (
    "cannot predict: the main thread waited out every all-gather (FSDP2 issues them with async_op=False, and on "
    "CPU/gloo there is no stream to run them beside compute), so a prefetched all-gather still blocks the thread "
    "and prefetch only moves the wait; no overlap can be replayed. `ddpdoctor tune --try forward_prefetch=1` "
    "measures it instead")
CANNOT_OLD = ("cannot predict: this run's summary has no per-unit compute times (written by an older ddpdoctor); "
              "re-analyse the traces")


@dataclass
class PassSlot:
    """One all-gather of one pass, in issue order: its unit, its duration, whether the run prefetched it, and the
    compute after it up to the next all-gather's end (None: the pass's last)."""

    unit: str
    all_gather_us: float
    prefetched: bool
    compute_after_us: float | None


def waits(slots: list[PassSlot], prefetch_all: bool) -> list[float]:
    """Per slot, how long the compute lane waited for its all-gather (the first slot: its whole all-gather)."""
    out: list[float] = []
    ag_free = 0.0  # the all-gather lane is free from here
    comp_end = 0.0  # the previous unit's compute ends here
    comp_start = 0.0
    for k, s in enumerate(slots):
        if k == 0:
            issue = 0.0
        else:
            issue = comp_start if (prefetch_all or s.prefetched) else comp_end
        ag_end = max(issue, ag_free) + s.all_gather_us
        ag_free = ag_end
        start = max(comp_end, ag_end)
        out.append(start - comp_end)
        comp_start = start
        comp_end = start + (s.compute_after_us or 0.0)
    return out


@dataclass
class PrefetchReplay:
    predictable: bool
    reason: str | None = None
    # per unit and pass ("forward", "backward"): exposed all-gather time one-deep prefetch saves, us summed over
    # ranks and steps
    saved_us: dict[tuple[str, str], float] = field(default_factory=dict)
    passes: int = 0  # (rank, step, pass) sequences replayed

    def to_json(self, steps: int, ranks: int) -> JsonObject:
        scale = 1e3 * max(1, steps * ranks)
        fwd = sum(v for (_, p), v in self.saved_us.items() if p == "forward")
        bwd = sum(v for (_, p), v in self.saved_us.items() if p == "backward")
        return {"predictable": self.predictable, "reason": self.reason,
                "forward_saved_ms": round(fwd / scale, 3) if self.predictable else None,
                "backward_saved_ms": round(bwd / scale, 3) if self.predictable else None}

    def unit_saved_ms(self, unit: str, phase: str, steps: int, ranks: int) -> float | None:
        if not self.predictable:
            return None
        return round(self.saved_us.get((unit, phase), 0.0) / (1e3 * max(1, steps * ranks)), 3)


def replay_prefetch(rows: list[UnitCollective]) -> PrefetchReplay:
    """The replay over every (rank, step, pass) of ``rows`` (analyses/fsdp_units.py's). Linear in rows."""
    seqs: dict[tuple[int, int | None, str], list[UnitCollective]] = {}
    for r in rows:
        if r.op == "all_gather":
            seqs.setdefault((r.rank, r.step, r.phase), []).append(r)
    if not seqs:
        return PrefetchReplay(False, "no FSDP2 all-gather was recorded")
    if any(r.synchronous for seq in seqs.values() for r in seq):
        return PrefetchReplay(False, CANNOT_SYNC)
    if any(r.compute_after_us is None for seq in seqs.values() for r in seq[:-1]):
        return PrefetchReplay(False, CANNOT_OLD)
    out = PrefetchReplay(True)
    for (_rank, _step, phase), seq in seqs.items():
        seq = sorted(seq, key=lambda r: r.start_us)
        slots = [PassSlot(r.unit, r.dur_us, r.prefetched, r.compute_after_us) for r in seq]
        base, ahead = waits(slots, False), waits(slots, True)
        for r, b, a in zip(seq, base, ahead, strict=True):
            # never more than the run left exposed (the CPU running ahead may have hidden an on-demand one already)
            key = (r.unit, phase)
            out.saved_us[key] = out.saved_us.get(key, 0.0) + min(max(0.0, b - a), r.exposed_us)
        out.passes += 1
    return out

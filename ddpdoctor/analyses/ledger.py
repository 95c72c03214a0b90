"""Caused wait from the collective ledger: which rank the job waits for, in which phase, at what cost per step.

Pure: plain per-rank, per-step summaries in (each rank's blocked time in collectives and its own work per phase,
probes/ledger.py), typed results out. The rule (docs/metrics.md#caused-wait): at a collective the last rank to
arrive spends only the transfer inside it and the early ranks spend wait + transfer, so per step

    deficit(r) = median over the other ranks of blocked time - blocked time of r

is how long the others waited for r. A rank is waited for when its median deficit over the window exceeds
max(2 ms, 5% of the step) and its deficit exceeds half of that in 70% of the window's steps (a one-off is not);
its phase is the one where its own work exceeds the others' most (None when that excess explains less than half of
the wait it causes).
No cross-host clock; linear in ranks x steps (above 32 ranks the median over every rank stands for "the others":
one rank no longer moves it). Steps a rank marks GAP (its blocked time unknown, probes/flight.py) are left out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import TypedDict

import numpy as np

from ddpdoctor.analyses.intervals import Interval, bootstrap
from ddpdoctor.jsontypes import JsonObject

BLOCKED = "collective"  # the phase key under which a rank's tracker counts time blocked in collectives
# On the NCCL source (probes/flight.py) BLOCKED is the device's time in collectives; the host's own blocked time is
# kept under HOST_BLOCKED, and a step whose device time could not be known carries GAP (left out of the window).
HOST_BLOCKED = "host_collective"
GAP = "ledger_gap"
# The training thread's run-queue wait in the step (seconds it was runnable but no CPU ran it; Linux's
# /proc/thread-self/schedstat, probes/steps.py): sent with the phases under this key, but not a phase (it overlaps
# them). It is subtracted from a rank's lateness: what the OS made a rank wait for a CPU is the host's, not the job's.
CPU_WAIT = "cpu_wait"
# The rank's process's CPU time in the step, every thread's (time.process_time()): a rank whose own threads keep
# its cores busy (a busy thread, a GIL-holding logger) made its run-queue wait itself, so that part is its own.
CPU_TIME = "cpu_time"
# Keys that are not the rank's own work (time blocked in collectives is kept apart).
NOT_WORK = (BLOCKED, HOST_BLOCKED, GAP, CPU_WAIT, CPU_TIME)
# Linux's minimum scheduler slice (CFS sched_min_granularity / EEVDF base_slice): on a host with fewer cores than
# ranks plus their launcher, which rank the OS sets aside for a slice or two is the OS's choice, not the job's.
SCHED_SLICE_S = 0.00075
CROWDED_SLICES = 4  # below this many slices of cost on a crowded host: a note, not a slow rank


@dataclass(frozen=True)
class LedgerConfig:
    warmup_steps: int = 5
    window_steps: int = 30
    min_steps: int = 10
    rel: float = 0.05  # the others wait more than 5% of the step ...
    min_s: float = 0.002  # ... and more than 2 ms ...
    persist_frac: float = 0.7  # ... in at least 70% of the window's steps (by more than half the threshold)


DEFAULT = LedgerConfig()


class CausedWaitJson(TypedDict):
    """A CausedWait as JSON (the live snapshot's "waited_for", a slow-rank alert's evidence): ms, rounded."""

    rank: int
    phase: str | None
    cost_ms_per_step: float
    cost_pct_of_step: float
    caused_wait_ms_per_step: float
    interval_ms: JsonObject  # analyses/intervals.py Interval.to_json: value, interval [lo, hi], n
    step_ms: float
    phase_excess_ms: float
    own_blocked_ms: float
    others_blocked_ms: float
    persist_frac: float
    steps: list[int]  # [first, last] of the window
    ranks_compared: int


@dataclass(frozen=True)
class CausedWait:
    """One rank the others wait for, over ``steps`` (first, last) of the window."""

    rank: int
    cost_s: float  # median per step of (others' blocked time - its own)
    interval: Interval  # bootstrap interval of that median, seconds
    pct_of_step: float
    step_s: float
    phase: str | None  # where its own work exceeds the others' most
    phase_excess_s: float
    own_blocked_s: float
    others_blocked_s: float
    persist_frac: float  # share of the window's steps with a deficit above half the threshold
    steps: tuple[int, int]
    ranks_compared: int

    def to_json(self) -> CausedWaitJson:
        return {
            "rank": self.rank, "phase": self.phase, "cost_ms_per_step": round(self.cost_s * 1e3, 3),
            "cost_pct_of_step": round(self.pct_of_step, 1), "caused_wait_ms_per_step": round(self.cost_s * 1e3, 3),
            "interval_ms": self.interval.to_json(scale=1e3, digits=3), "step_ms": round(self.step_s * 1e3, 3),
            "phase_excess_ms": round(self.phase_excess_s * 1e3, 3), "own_blocked_ms": round(self.own_blocked_s * 1e3, 3),
            "others_blocked_ms": round(self.others_blocked_s * 1e3, 3), "persist_frac": round(self.persist_frac, 2),
            "steps": list(self.steps), "ranks_compared": self.ranks_compared,
        }


@dataclass(frozen=True)
class LedgerVerdict:
    waited_for: list[CausedWait]
    caused_s: dict[int, float]  # every rank's median deficit over the window (>= 0): the per-rank export
    notes: list[str]
    # rank -> (blocked, waiting, transfer) seconds per step (medians): the last rank to arrive at a step's
    # collectives spends only the transfer blocked, so per step transfer = the least blocked time of any rank and
    # waiting = a rank's blocked time less that (docs/metrics.md#caused-wait). Host dispatch is not seen live.
    split_s: dict[int, tuple[float, float, float]] = field(default_factory=dict)


Record = tuple[int, float, Mapping[str, float]]  # (step, seconds, {phase: seconds}) as the tracker keeps it


def common_window(per_rank: Mapping[int, Sequence[Record]], cfg: LedgerConfig = DEFAULT) -> list[int]:
    """The last ``window_steps`` steps past warm-up that every rank reported with a known blocked time."""
    sets = [{rec[0] for rec in recs if GAP not in rec[2]} for recs in per_rank.values() if recs]
    if len(sets) < 2:
        return []
    common = set.intersection(*sets)
    return sorted(s for s in common if s > cfg.warmup_steps)[-cfg.window_steps:]


def too_few_steps_note(steps: int, cfg: LedgerConfig = DEFAULT) -> str:
    """What the caused-wait rule says of a job too short for it."""
    return (f"collective ledger: {steps} step(s) every rank reported past the {cfg.warmup_steps} warm-up steps; "
            f"{cfg.min_steps} are needed to judge which rank the others wait for: not judged")


def caused_wait(per_rank: Mapping[int, Sequence[Record]], cfg: LedgerConfig = DEFAULT,
                crowded: Mapping[int, str] | None = None) -> LedgerVerdict:
    """The ranks the others persistently wait for. ``crowded``: rank -> "N ranks on M cores" for ranks on a host
    with fewer cores than ranks plus launcher (a cost under CROWDED_SLICES scheduler slices there is a note)."""
    steps = common_window(per_rank, cfg)
    if not any(BLOCKED in rec[2] for recs in per_rank.values() for rec in recs[-3:]):
        return LedgerVerdict([], {}, [])  # no rank measured blocked time (no ledger): nothing to say
    if len(steps) < cfg.min_steps:
        # Never silence: a job too short for the rule is said to be so (docs/metrics.md#caused-wait).
        return LedgerVerdict([], {}, [too_few_steps_note(len(steps), cfg)] if len(per_rank) > 1 else [])
    ranks = sorted(r for r, recs in per_rank.items() if recs)
    index = {s: j for j, s in enumerate(steps)}
    shape = (len(ranks), len(steps))
    size = shape[0] * shape[1]
    # Flat Python lists, turned into arrays once: a list store is ~10x cheaper than a numpy element store.
    blocked_l, total_l, runq_l, cpu_l = [0.0] * size, [0.0] * size, [0.0] * size, [0.0] * size
    by_phase_l: dict[str, list[float]] = {}  # one pass over the window's records: a phase's list when first seen
    first = steps[0]
    for i, r in enumerate(ranks):
        base = i * shape[1]
        for step, secs, ph in reversed(per_rank[r]):  # newest first: stop at the window's start
            if step < first:
                break
            j = index.get(step)
            if j is None:
                continue
            k = base + j
            total_l[k] = secs
            for p, v in ph.items():
                if p in NOT_WORK:
                    if p == BLOCKED:
                        blocked_l[k] = v
                    elif p == CPU_WAIT:
                        runq_l[k] = v
                    elif p == CPU_TIME:
                        cpu_l[k] = v
                    continue
                col = by_phase_l.get(p)
                if col is None:
                    col = by_phase_l[p] = [0.0] * size
                col[k] = v
    blocked = np.array(blocked_l).reshape(shape)
    total = np.array(total_l).reshape(shape)
    by_phase = {p: np.array(v).reshape(shape) for p, v in by_phase_l.items()}
    phases = sorted(by_phase)
    own = np.stack([by_phase[p] for p in phases], axis=2) if phases else np.zeros((*shape, 1))
    runq = np.array(runq_l).reshape(shape)
    return judge(ranks, steps, blocked, own, phases, total, cfg, crowded,
                 cpu_wait_excess(runq, np.array(cpu_l).reshape(shape), big=len(ranks) > 32))


def _over_others(x: np.ndarray, big: bool) -> np.ndarray:
    """Per rank and step, x minus the other ranks' median (above 32 ranks, every rank's median)."""
    if big:
        return x - np.median(x, axis=0)[None, :]
    return np.stack([x[i] - np.median(np.delete(x, i, axis=0), axis=0) for i in range(x.shape[0])])


def cpu_wait_excess(runq: np.ndarray, cpu: np.ndarray, big: bool) -> np.ndarray | None:
    """Per rank and step (ranks, steps): how much longer the rank's training thread waited for a CPU than the
    others (median), less what its own process used beyond theirs (its own busy threads made that wait), never
    below 0; None where no rank measured it (docs/metrics.md#run-queue-wait)."""
    if runq.shape[0] < 2 or not runq.any():
        return None
    return np.maximum(_over_others(runq, big) - np.maximum(_over_others(cpu, big), 0.0), 0.0)


def judge(ranks: list[int], steps: list[int], blocked: np.ndarray, own: np.ndarray, phases: list[str],
          total: np.ndarray, cfg: LedgerConfig = DEFAULT, crowded: Mapping[int, str] | None = None,
          q: np.ndarray | None = None) -> LedgerVerdict:
    """The rule on arrays: blocked (ranks, steps), own work (ranks, steps, phases), step seconds (ranks, steps),
    the CPU-wait excess (ranks, steps; cpu_wait_excess) where measured."""
    n = len(ranks)
    step_s = float(np.median(np.median(total, axis=0)))
    threshold = max(cfg.min_s, cfg.rel * step_s)
    big = n > 32
    ref_blocked = np.median(blocked, axis=0) if big else None
    ref_own = np.median(own, axis=0) if big else None
    all_d = -_over_others(blocked, big)  # the others' median blocked time - r's (above 32 ranks one vectorised pass)
    med_deficit = np.median(all_d, axis=1)
    deficits = {int(i): all_d[i] for i in np.flatnonzero(med_deficit > threshold)}
    caused = {ranks[i]: round(max(0.0, float(med_deficit[i])), 6) for i in range(n)}
    least = blocked.min(axis=0)
    transfer = float(np.median(least))
    waiting = np.median(blocked - least, axis=1)
    blocked_med = np.median(blocked, axis=1)
    split = {ranks[i]: (round(float(blocked_med[i]), 6), round(float(waiting[i]), 6), round(transfer, 6))
             for i in range(n)}
    out: list[CausedWait] = []
    notes: list[str] = []
    def crowded_note(i: int) -> bool:
        where = (crowded or {}).get(ranks[i])
        if not where or med_deficit[i] >= CROWDED_SLICES * SCHED_SLICE_S:
            return False
        notes.append(f"rank {ranks[i]} kept the others waiting {med_deficit[i] * 1e3:.2f} ms per step, under "
                     f"{CROWDED_SLICES} scheduler slices on a host with {where}: which rank the OS sets aside "
                     "decides that, not the job; with a core per rank and one for the launcher it is measurable")
        return True

    worst = int(np.argmax(med_deficit)) if n else -1
    if worst >= 0 and worst not in deficits and threshold / 2 < med_deficit[worst] <= threshold \
            and not crowded_note(worst):
        notes.append(f"rank {ranks[worst]} kept the others waiting {med_deficit[worst] * 1e3:.2f} ms per step "
                     f"(median of steps {steps[0]}-{steps[-1]}), under the slow-rank threshold "
                     f"{threshold * 1e3:.2f} ms (max({cfg.min_s * 1e3:.0f} ms, {cfg.rel:.0%} of the "
                     f"{step_s * 1e3:.1f} ms step)): not named")
    for i, d in deficits.items():
        if crowded_note(i):
            continue
        if q is not None:  # what the OS kept it waiting for a CPU beyond the others is not its own lateness
            own_late = float(np.median(d - q[i]))
            if own_late <= threshold:
                notes.append(f"rank {ranks[i]} kept the others waiting {med_deficit[i] * 1e3:.2f} ms per step "
                             f"(median), but it waited {float(np.median(q[i])) * 1e3:.2f} ms per step longer than "
                             "they did for a CPU (run queue, /proc schedstat): the host's CPUs are contended (other "
                             "processes, or more busy threads than cores), not the job's own work; without it, "
                             f"{max(own_late, 0.0) * 1e3:.2f} ms is under the {threshold * 1e3:.2f} ms threshold: "
                             "not named")
                continue
            d = d - q[i]
        persist = float(np.mean(d > threshold / 2))
        if persist < cfg.persist_frac:
            notes.append(f"rank {ranks[i]} kept the others waiting {med_deficit[i] * 1e3:.2f} ms per step (median), "
                         f"over the {threshold * 1e3:.2f} ms threshold, but in only {persist:.0%} of steps "
                         f"{steps[0]}-{steps[-1]} ({cfg.persist_frac:.0%} needed): not named")
            continue
        iv = bootstrap(d.tolist(), median)
        if iv is None:
            notes.append(f"rank {ranks[i]} kept the others waiting {med_deficit[i] * 1e3:.2f} ms per step (median), "
                         f"over the {threshold * 1e3:.2f} ms threshold, but too few steps give it an interval: "
                         "not named")
            continue
        others_own = ref_own if ref_own is not None else np.median(np.delete(own, i, axis=0), axis=0)
        excess = np.median(own[i] - others_own, axis=0)
        k = int(np.argmax(excess)) if phases else 0
        others_blocked = ref_blocked if ref_blocked is not None else np.median(np.delete(blocked, i, axis=0), axis=0)
        out.append(CausedWait(
            rank=ranks[i], cost_s=float(med_deficit[i]), interval=iv,
            pct_of_step=100.0 * float(med_deficit[i]) / step_s if step_s > 0 else 0.0, step_s=step_s,
            # No phase when its longest excess explains less than half the wait it causes: on NCCL, a rank slow on
            # its GPU (the host only queues kernels) makes the others wait without a longer host phase. A share of
            # the wait, not of the step: a loaded host stretches the step, not the share (a CI run lost the phase
            # of a 40 ms sleep when half of 5% of a stretched step exceeded it).
            phase=phases[k] if phases and excess[k] > 0.5 * float(med_deficit[i]) else None,
            phase_excess_s=float(excess[k]) if phases else 0.0,
            own_blocked_s=float(np.median(blocked[i])), others_blocked_s=float(np.median(others_blocked)),
            persist_frac=persist, steps=(steps[0], steps[-1]), ranks_compared=n,
        ))
    out.sort(key=lambda c: -c.cost_s)
    return LedgerVerdict(out, caused, notes, split)

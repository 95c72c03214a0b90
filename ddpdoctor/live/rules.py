"""The live health rules, pure functions of per-rank iteration records: slow-rank, slowdown and stall.

Inputs are plain data (so tests hand them synthetic series, thousands of ranks): a rank's iterations as
``StepRecord`` (step, seconds, {phase: seconds}) and the job's series as ``JobPoint`` (one per step: the median
rank's time). Outputs are the alert's evidence as JSON-ready TypedDicts (live/records.py), never printed or written
here.

Why phases and not step times: DDP synchronises every iteration, so every rank's step takes as long as the slowest
one's. A slow rank shows as more time in a phase it runs alone (data, forward, optimizer, ...) while the others
wait for it in backward (DDP's gradient all-reduce) or in a blocking collective; those two are WAIT_PHASES."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from ddpdoctor.analyses.ledger import CPU_TIME, CPU_WAIT, cpu_wait_excess
from ddpdoctor.live.records import Outlier, SlowdownEvidence, SlowRankEvidence

WAIT_PHASES = ("backward", "collective")
LOSS_PHASES = ("data", "forward", "optimizer", "eval", "checkpoint", "other")
EXPLAINED_PHASES = ("eval", "checkpoint")  # a long step spent here is the job's own periodic work


@dataclass(frozen=True)
class StepRecord:
    step: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class JobPoint:
    """One iteration of the job: the median rank's time and phases; ``top_*``: the rank that spent most outside
    the wait phases (who the others waited for)."""

    step: int
    seconds: float
    phases: dict[str, float] = field(default_factory=dict)
    top_rank: int | None = None
    top_phase: str | None = None


@dataclass(frozen=True)
class HealthConfig:
    warmup_steps: int = 5  # DDP builds and rebuilds its buckets in the first iterations
    window_steps: int = 30  # the recent iterations the slow-rank and slowdown rules look at
    baseline_steps: int = 30  # the job's own reference for slowdown: its first iterations after warm-up
    slow_rank_rel: float = 0.05  # a rank must lose more than 5% of the step ...
    slow_rank_min_s: float = 0.002  # ... and more than 2 ms (timer and scheduling noise)
    persist_frac: float = 0.7  # ... in at least 70% of the window's iterations
    slow_rank_snr: float = 1.0  # ... and above this many robust standard deviations of its own per-iteration excess
    slowdown_rel: float = 0.15  # the job's step time rose by more than 15% ...
    noise_k: float = 4.0  # ... and by more than 4 robust standard deviations of its baseline
    stall_factor: float = 4.0  # a step 4x the usual ...
    stall_min_s: float = 0.2  # ... and at least 0.2 s longer (shorter hiccups are not worth a line)
    stall_history: int = 50  # the usual: median of this many preceding iterations


DEFAULT_CONFIG = HealthConfig()


def _mad_sigma(values: np.ndarray) -> float:
    """Robust standard deviation (1.4826 x median absolute deviation)."""
    if values.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


def common_steps(per_rank: dict[int, list[StepRecord]], cfg: HealthConfig) -> list[int]:
    """The last ``window_steps`` iterations (after warm-up) that every rank reported."""
    sets = [{r.step for r in recs} for recs in per_rank.values() if recs]
    if len(sets) < 2:
        return []
    common = set.intersection(*sets)
    return sorted(s for s in common if s > cfg.warmup_steps)[-cfg.window_steps:]


def slow_ranks(per_rank: dict[int, list[StepRecord]], cfg: HealthConfig = DEFAULT_CONFIG) -> list[SlowRankEvidence]:
    """Ranks persistently slower than the others, with the phase where each loses its time (largest loss first).

    For each iteration and phase, a rank's excess is its time minus the median of the other ranks' (every rank's
    median above 32 ranks, where one rank no longer moves it). The rank is slow when its median excess in one
    phase exceeds max(5% of the step, 2 ms) and its excess is above half that in 70% of the iterations, and the
    median excess is larger than the excess's own spread (one robust standard deviation across the iterations):
    on a loaded host the scheduler delays one rank by a few ms more than the other now and then, which moves the
    median past 2 ms with a spread larger than itself (the benchmark's straggler-free job at load 23 on 2 cores:
    2.0 ms lost, 3.0 ms spread), while a straggler loses the same time every iteration."""
    steps = common_steps(per_rank, cfg)
    if len(steps) < max(5, cfg.window_steps // 2):
        return []
    ranks = sorted(r for r, recs in per_rank.items() if recs)
    index = {s: i for i, s in enumerate(steps)}
    phases = LOSS_PHASES + WAIT_PHASES
    t = np.zeros((len(ranks), len(steps), len(phases)))
    total = np.zeros((len(ranks), len(steps)))
    runq = np.zeros((len(ranks), len(steps)))
    cpu = np.zeros((len(ranks), len(steps)))
    for i, r in enumerate(ranks):
        for rec in per_rank[r]:
            j = index.get(rec.step)
            if j is None:
                continue
            total[i, j] = rec.seconds
            runq[i, j] = rec.phases.get(CPU_WAIT, 0.0)
            cpu[i, j] = rec.phases.get(CPU_TIME, 0.0)
            for k, p in enumerate(phases):
                t[i, j, k] = rec.phases.get(p, 0.0)
    step_s = float(np.median(np.median(total, axis=0)))
    threshold = max(cfg.slow_rank_min_s, cfg.slow_rank_rel * step_s)
    everyone = np.median(t, axis=0) if len(ranks) > 32 else None
    # A rank's phases are longer by what the OS kept it waiting for a CPU beyond the others: the host's, not its own.
    queued = cpu_wait_excess(runq, cpu, big=everyone is not None)
    nloss = len(LOSS_PHASES)
    out: list[SlowRankEvidence] = []
    for i, r in enumerate(ranks):
        others = everyone if everyone is not None else np.median(np.delete(t, i, axis=0), axis=0)
        excess = t[i] - others  # (steps, phases)
        if queued is not None:
            excess[:, :nloss] -= queued[i][:, None]
        med = np.median(excess[:, :nloss], axis=0)
        k = int(np.argmax(med))
        loss = float(med[k])
        if loss <= threshold or float(np.mean(excess[:, k] > threshold / 2)) < cfg.persist_frac:
            continue
        noise = _mad_sigma(excess[:, k])
        if loss <= cfg.slow_rank_snr * noise:
            continue
        waited = float(-np.median(excess[:, nloss:].sum(axis=1)))  # how much more the others sat in wait phases
        out.append({
            "rank": r, "phase": LOSS_PHASES[k], "lost_ms_per_step": round(loss * 1e3, 3),
            "pct_of_step": round(100 * loss / step_s, 1) if step_s > 0 else None,
            "step_ms": round(step_s * 1e3, 3), "rank_phase_ms": round(float(np.median(t[i, :, k])) * 1e3, 3),
            "others_phase_ms": round(float(np.median(others[:, k])) * 1e3, 3),
            "others_waited_ms_per_step": round(waited * 1e3, 3), "noise_ms": round(noise * 1e3, 3),
            "steps": [steps[0], steps[-1]], "ranks_compared": len(ranks),
        })
    return sorted(out, key=lambda a: -a["lost_ms_per_step"])


def slowdown(series: list[JobPoint], cfg: HealthConfig = DEFAULT_CONFIG) -> SlowdownEvidence | None:
    """The job's step time now (median of the last ``window_steps``) against its own first ``baseline_steps``
    after warm-up: a regression above max(15%, 4 robust sigmas of the baseline). Medians ignore the occasional
    evaluation or checkpoint step."""
    pts = [p for p in series if p.step > cfg.warmup_steps]
    if len(pts) < cfg.baseline_steps + cfg.window_steps:
        return None
    base = np.array([p.seconds for p in pts[:cfg.baseline_steps]])
    recent = np.array([p.seconds for p in pts[-cfg.window_steps:]])
    b, c = float(np.median(base)), float(np.median(recent))
    threshold = max(cfg.slowdown_rel * b, cfg.noise_k * _mad_sigma(base))
    # What the ranks now wait for a CPU beyond their baseline is the host's getting busier, not the job's (less
    # whatever more CPU the job's own process now uses: docs/metrics.md#run-queue-wait).
    queued = max(0.0, _median_of(pts[-cfg.window_steps:], CPU_WAIT) - _median_of(pts[:cfg.baseline_steps], CPU_WAIT)
                 - max(0.0, _median_of(pts[-cfg.window_steps:], CPU_TIME)
                       - _median_of(pts[:cfg.baseline_steps], CPU_TIME)))
    if c - b - queued <= threshold:
        return None
    # Where it began: walk back while the centred 5-step median before the onset stays above the halfway mark.
    secs = [p.seconds for p in pts]
    onset = len(pts) - 1
    while onset - 3 >= cfg.baseline_steps and float(np.median(secs[onset - 3:onset + 2])) > b + threshold / 2:
        onset -= 1
    recent_pts = pts[-cfg.window_steps:]
    top = _most_common([p.top_phase for p in recent_pts if p.top_phase])
    return {
        "baseline_ms": round(b * 1e3, 3), "current_ms": round(c * 1e3, 3), "cost_ms_per_step": round((c - b) * 1e3, 3),
        "pct_slower": round(100 * (c - b) / b, 1) if b > 0 else None, "since_step": pts[onset].step,
        "baseline_steps": [pts[0].step, pts[cfg.baseline_steps - 1].step], "recent_steps": [recent_pts[0].step,
                                                                                             recent_pts[-1].step],
        "noise_ms": round(_mad_sigma(base) * 1e3, 3), "top_phase": top, "cpu_wait_rise_ms": round(queued * 1e3, 3),
    }


def _median_of(points: Sequence[JobPoint], key: str) -> float:
    return float(np.median([p.phases.get(key, 0.0) for p in points])) if points else 0.0


T = TypeVar("T")


def _most_common(values: list[T]) -> T | None:
    return max(set(values), key=values.count) if values else None


def outliers(series: list[JobPoint], cfg: HealthConfig = DEFAULT_CONFIG,
             known: list[int] | None = None) -> list[Outlier]:
    """Steps far above the usual, each classified: "stall", "periodic" (evaluation or checkpoint time, or a step
    that recurs at a fixed period with earlier outliers) or nothing. ``usual``: median of the preceding
    ``stall_history`` iterations (at least 10). ``known``: outlier steps found earlier (older than ``series``)."""
    pts = [p for p in series if p.step > cfg.warmup_steps]
    out: list[Outlier] = []
    for i, p in enumerate(pts):
        if i < 10:
            continue
        usual = float(np.median([q.seconds for q in pts[max(0, i - cfg.stall_history):i]]))
        excess = p.seconds - usual
        if p.seconds <= cfg.stall_factor * usual or excess <= cfg.stall_min_s:
            continue
        explained = sum(p.phases.get(k, 0.0) for k in EXPLAINED_PHASES)
        earlier = sorted(set(known or ()) | {o["step"] for o in out})
        period = _period(earlier, p.step)
        kind = "periodic" if explained >= 0.5 * excess or period else "stall"
        out.append({
            "step": p.step, "seconds": round(p.seconds, 3), "usual_s": round(usual, 4), "excess_s": round(excess, 3),
            "kind": kind, "why": ("evaluation/checkpoint time" if explained >= 0.5 * excess else
                                  f"recurs every {period} steps" if period else None),
            "rank": p.top_rank, "phase": p.top_phase,
        })
    return out


def _period(earlier: list[int], step: int) -> int | None:
    """A period P with outliers at step-P and step-2P (the recurring pattern learnt from the series itself)."""
    seen = set(earlier)
    for prev in reversed(earlier[-16:]):
        gap = step - prev
        if gap > 0 and (prev - gap) in seen:
            return gap
    return None


def recurring_after_all(found: Sequence[Mapping[str, object]]) -> set[int]:
    """At the end of the run: stall steps that later turned out to be one of three or more equally spaced outliers.
    ``found``: the stalls' evidence as read back from alerts.jsonl (a step that is not an integer is left out)."""
    steps = sorted(s for o in found if isinstance(s := o.get("step"), int))
    seen = set(steps)
    out: set[int] = set()
    for a in steps:
        for b in steps:
            gap = b - a
            if gap > 0 and (b + gap in seen or a - gap in seen):
                out.update({a, b})
    return out

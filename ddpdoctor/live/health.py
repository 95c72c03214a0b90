"""The monitor's live health state: ingests the iteration records of the heartbeats, keeps bounded series, runs the
rules (ddpdoctor/live/rules.py) about once a second and writes the live state into RUN/live/.

    RUN/live/NODE/health.json     the latest snapshot (what `ddpdoctor status` and the Prometheus exporter show)
    RUN/live/NODE/series.jsonl    the job's iterations (step, median time, phases), a ring of the last ~10,000
    RUN/live/NODE/alerts.jsonl    every alert raised while the job ran (the report turns them into findings)

NODE is node<N> (torchrun's --node-rank) or rank<R> (--launcher none, one monitor per rank): on a shared
filesystem every node's monitor writes its own ranks' view, and readers merge the nodes, without a job-wide store."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import IO

import numpy as np

from ddpdoctor.analyses.ledger import CPU_TIME, CPU_WAIT, CausedWaitJson, caused_wait
from ddpdoctor.live.records import (
    Alert,
    DivergenceEvidence,
    HealthSnapshot,
    Outlier,
    RankHealth,
    SlowdownEvidence,
    SlowRankEvidence,
)
from ddpdoctor.live.rules import (
    DEFAULT_CONFIG,
    LOSS_PHASES,
    HealthConfig,
    JobPoint,
    StepRecord,
    outliers,
    slow_ranks,
    slowdown,
)
from ddpdoctor.rundir.layout import write_private_text

VERSION = 1
RANK_HISTORY = 256  # iterations kept per rank
JOB_HISTORY = 4096  # job points kept in memory (the baseline is kept apart)
SERIES_LINES = 10_000
MAX_ALERTS = 200
MAX_STEPS_PER_BEAT = 256


_NODE = re.compile(r"^(node|rank)\d{1,6}$")


def live_dir(run_root: Path) -> Path:
    return run_root / "live"


def node_dir(run_root: Path, node: str) -> Path:
    return live_dir(run_root) / node


def node_names(run_root: Path) -> list[str]:
    """The nodes whose monitors wrote live state into this run directory."""
    try:
        return sorted(p.name for p in live_dir(run_root).iterdir() if _NODE.match(p.name) and p.is_dir())
    except OSError:
        return []


class LiveHealth:
    """Thread-safe: ``ingest`` runs on the monitor's connection handlers, ``tick``/``finish`` on its poll loop."""

    def __init__(self, run_root: Path, world_size: int | None = None, config: HealthConfig = DEFAULT_CONFIG,
                 eval_interval_s: float = 1.0, on_alert: Callable[[Alert], None] | None = None,
                 node: str = "node0") -> None:
        self.root = node_dir(run_root, node)
        self.node = node
        self.world_size = world_size
        self.local_ranks = 0  # ranks connected to this node's monitor (set by the watch)
        self.cfg = config
        self.eval_interval_s = eval_interval_s
        self.on_alert = on_alert
        self.ranks: dict[int, deque[StepRecord]] = {}
        self.phase_now: dict[int, str | None] = {}
        self.pending: dict[int, dict[int, StepRecord]] = {}  # step -> rank -> record, until every rank has it
        self.baseline: list[JobPoint] = []
        self.series: deque[JobPoint] = deque(maxlen=JOB_HISTORY)
        self.alerts: list[Alert] = []
        self.caused_s: dict[int, float] = {}  # per rank: how long the others wait for it per step (the ledger)
        self.split_s: dict[int, tuple[float, float, float]] = {}  # per rank: blocked, waiting, transfer per step
        self.waited_for: list[CausedWaitJson] = []  # the ranks the others persistently wait for, now
        self.ledger_notes: list[str] = []
        self.started = time.time()
        self.last_snapshot: HealthSnapshot | None = None
        self.cost_s = 0.0  # the monitor's own time in ingest + tick (reported in the snapshot)
        self._raised: set[tuple[str, int | str]] = set()  # (alert id, the rank, step or "job" it is about)
        self._outlier_steps: set[int] = set()
        self._new_points: list[JobPoint] = []
        self._series_lines = 0
        self._last_eval = 0.0
        self._lock = threading.Lock()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for name in ("health.json", "series.jsonl", "alerts.jsonl"):
            (self.root / name).unlink(missing_ok=True)

    # -- input ---------------------------------------------------------------------------------------
    def ingest(self, rank: int, steps: object, phase: str | None = None) -> None:
        """One beat's iterations: ``[[step, seconds, {phase: seconds}], ...]`` (malformed entries are skipped)."""
        t0 = time.perf_counter()
        with self._lock:
            self.phase_now[rank] = phase
            if not isinstance(steps, list):
                return
            hist = self.ranks.setdefault(rank, deque(maxlen=RANK_HISTORY))
            for item in steps[-MAX_STEPS_PER_BEAT:]:
                rec = _record(item)
                if rec is None:
                    continue
                hist.append(rec)
                if len(self.pending) < 4 * RANK_HISTORY or rec.step in self.pending:
                    self.pending.setdefault(rec.step, {})[rank] = rec
        self.cost_s += time.perf_counter() - t0

    # -- evaluation ----------------------------------------------------------------------------------
    def tick(self, now: float | None = None, force: bool = False) -> list[Alert]:
        """Run the rules when due; write the live files; return the alerts raised now."""
        now = time.time() if now is None else now
        # Above 1,000 ranks a pass costs ~80 ms per 1,000 ranks (benchmarks/live_cost.py): space them out so the
        # monitor stays under ~10% of a core.
        if not force and now - self._last_eval < max(self.eval_interval_s, len(self.ranks) / 1000):
            return []
        t0 = time.perf_counter()
        self._last_eval = now
        with self._lock:
            self._settle_steps(final=force)
            per_rank = {r: list(h)[-self.cfg.window_steps * 2:] for r, h in self.ranks.items()}
            series = self._series()
        fresh = self._evaluate(per_rank, series, now)
        self._write(now, per_rank, series, finished=False)
        self.cost_s += time.perf_counter() - t0
        for alert in fresh:
            if self.on_alert is not None:
                self.on_alert(alert)
        return fresh

    def finish(self) -> list[Alert]:
        """The job ended: last evaluation, and a snapshot that says so."""
        fresh = self.tick(force=True)
        with self._lock:
            per_rank = {r: list(h)[-self.cfg.window_steps * 2:] for r, h in self.ranks.items()}
            series = self._series()
        self._write(time.time(), per_rank, series, finished=True)
        return fresh

    def _series(self) -> list[JobPoint]:
        """The baseline, then the newest points (the deque also holds the baseline until it overflows)."""
        last = self.baseline[-1].step if self.baseline else -1
        return self.baseline + [p for p in self.series if p.step > last]

    def _settle_steps(self, final: bool) -> None:
        """Steps every rank reported (or all of them at the end) become job points, in step order."""
        # The ranks this monitor watches (a node's share of the job), not the job's world size.
        expected = max(len(self.ranks), self.local_ranks)
        newest = {r: h[-1].step for r, h in self.ranks.items() if h}
        horizon = min(newest.values()) if newest and len(newest) >= expected else None
        for step in sorted(self.pending):
            recs = self.pending[step]
            if not final and len(recs) < expected and (horizon is None or step > horizon - 2):
                break
            del self.pending[step]
            point = _job_point(step, recs)
            if len(self.baseline) < self.cfg.warmup_steps + self.cfg.baseline_steps:
                self.baseline.append(point)
            self.series.append(point)
            self._new_points.append(point)

    def _evaluate(self, per_rank: dict[int, list[StepRecord]], series: list[JobPoint],
                  now: float) -> list[Alert]:
        fresh: list[Alert] = []
        slow = _with_caused_wait(slow_ranks(per_rank, self.cfg), self._ledger(per_rank))
        for ev in slow:
            fresh += self._raise("slow-rank", ev["rank"], ev, now,
                                 _slow_title(ev),
                                 ranks=[ev["rank"]], cost_ms=ev["lost_ms_per_step"])
        self._rearm("slow-rank", {ev["rank"] for ev in slow})
        down = slowdown(series, self.cfg)
        if down is not None:
            fresh += self._raise("slowdown", "job", down, now,
                                 f"the job's step time rose from {down['baseline_ms']:.1f} to {down['current_ms']:.1f} ms "
                                 f"(+{down['pct_slower']}%) since step {down['since_step']}",
                                 ranks=[], cost_ms=down["cost_ms_per_step"])
        else:
            self._rearm("slowdown", set())
        before = set(self._outlier_steps)
        for o in outliers(series[-(self.cfg.stall_history + 64):], self.cfg, sorted(before)):
            if o["step"] in before:
                continue  # judged on an earlier tick
            self._outlier_steps.add(o["step"])
            if o["kind"] != "stall":
                continue
            rank = o["rank"]
            where = f" (rank {rank}, {o['phase']})" if rank is not None else ""
            fresh += self._raise("stall", o["step"], o, now,
                                 f"step {o['step']} took {o['seconds']:.2f} s, {o['seconds'] / o['usual_s']:.0f}x "
                                 f"the usual {o['usual_s'] * 1e3:.0f} ms{where}",
                                 ranks=[rank] if rank is not None else [],
                                 cost_ms=o["excess_s"] * 1e3)
        return fresh

    def diverged(self, evidence: DivergenceEvidence, title: str, now: float) -> list[Alert]:
        """The job's divergence verdict (job/divergence.py, through the live watch): one alert, an error of the job
        rather than a cost, so its cost is 0; status, the Prometheus endpoint and the live scalars show it."""
        return self._raise("divergence", evidence["step"], evidence, now, title, evidence["ranks"], 0.0)

    def _raise(self, kind: str, key: int | str,
               evidence: SlowRankEvidence | SlowdownEvidence | Outlier | DivergenceEvidence, now: float,
               title: str, ranks: list[int], cost_ms: float) -> list[Alert]:
        if (kind, key) in self._raised or len(self.alerts) >= MAX_ALERTS:
            return []
        self._raised.add((kind, key))
        step = max((h[-1].step for h in self.ranks.values() if h), default=0)
        alert: Alert = {"id": kind, "time": round(now, 3), "step": step, "title": title, "ranks": ranks,
                        "cost_ms": round(cost_ms, 3), "evidence": evidence}
        self.alerts.append(alert)
        _append_line(self.root / "alerts.jsonl", alert)
        return [alert]

    def _rearm(self, kind: str, still: set[int]) -> None:
        """A condition that cleared may be raised again if it comes back."""
        self._raised = {(k, key) for k, key in self._raised if k != kind or key in still}

    def _ledger(self, per_rank: dict[int, list[StepRecord]]) -> list[CausedWaitJson]:
        """The collective ledger's verdict (analyses/ledger.py): who the others wait for, kept for the snapshot."""
        # This monitor runs on its ranks' host: with fewer usable cores than ranks plus launcher, a wait of a few
        # scheduler slices is the OS's choice of which rank runs (a note, not a slow rank).
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        local = self.local_ranks or len(per_rank)
        crowded = {r: f"{local} ranks on {cpus} cores" for r in per_rank} if cpus < local + 1 else None
        verdict = caused_wait({r: [(x.step, x.seconds, x.phases) for x in recs] for r, recs in per_rank.items()},
                              crowded=crowded)
        self.caused_s = verdict.caused_s
        self.split_s = verdict.split_s
        self.waited_for = [c.to_json() for c in verdict.waited_for]
        self.ledger_notes = verdict.notes
        return self.waited_for

    # -- output --------------------------------------------------------------------------------------
    def snapshot(self, now: float, per_rank: dict[int, list[StepRecord]], series: list[JobPoint],
                 finished: bool) -> HealthSnapshot:
        recent = [p.seconds for p in series[-self.cfg.window_steps:] if p.step > self.cfg.warmup_steps] or \
            [p.seconds for p in series[-self.cfg.window_steps:]]
        step_s = float(np.median(recent)) if recent else None
        ranks: dict[str, RankHealth] = {}
        for r, recs in sorted(per_rank.items()):
            tail = recs[-self.cfg.window_steps:]
            if not tail:
                continue
            # statistics.median: on 30 values it is ~10x cheaper than np.median's call overhead (x ranks x phases).
            med = median([x.seconds for x in tail])
            phases = {p: median([x.phases.get(p, 0.0) for x in tail]) for p in _phase_names(tail)}
            runq = phases.pop(CPU_WAIT, None)  # not phases: they overlap them
            phases.pop(CPU_TIME, None)
            total = sum(phases.values()) or 1.0
            busy = sum(v for p, v in phases.items() if p in LOSS_PHASES)
            row: RankHealth = {"step": tail[-1].step, "step_ms": round(med * 1e3, 3),
                               "busy_ms": round(busy * 1e3, 3),
                               "phase_share": {p: round(v / total, 4) for p, v in phases.items()},
                               "phase_now": self.phase_now.get(r),
                               "caused_wait_ms": round(self.caused_s.get(r, 0.0) * 1e3, 3)}
            if runq is not None:
                row["cpu_wait_ms"] = round(runq * 1e3, 3)
            split = self.split_s.get(r)
            if split is not None:
                row["blocked_ms"] = round(split[0] * 1e3, 3)
                row["waiting_ms"] = round(split[1] * 1e3, 3)
                row["transfer_ms"] = round(split[2] * 1e3, 3)
            ranks[str(r)] = row
        slowest = sorted(ranks, key=lambda r: -ranks[r]["busy_ms"])[:5]
        return {
            "version": VERSION, "node": self.node, "updated": round(now, 3), "started": round(self.started, 3), "finished": finished,
            "world_size": self.world_size, "ranks_reporting": len(ranks),
            "step": max((v["step"] for v in ranks.values()), default=0),
            "step_ms": round(step_s * 1e3, 3) if step_s else None,
            "steps_per_s": round(1.0 / step_s, 3) if step_s else None,
            "slowest_ranks": [int(r) for r in slowest], "ranks": ranks,
            "waited_for": self.waited_for[:5], "ledger_notes": self.ledger_notes[:5],
            "alerts": self.alerts[-50:], "alerts_total": len(self.alerts),
            "monitor_cost_s": round(self.cost_s, 4),
        }

    def _write(self, now: float, per_rank: dict[int, list[StepRecord]], series: list[JobPoint],
               finished: bool) -> None:
        try:
            snap = self.snapshot(now, per_rank, series, finished)
            self.last_snapshot = snap
            write_private_text(self.root / "health.json", json.dumps(snap, separators=(",", ":")))
            self._write_series()
        except OSError:
            pass  # a full disk must not stop the watch

    def _write_series(self) -> None:
        points, self._new_points = self._new_points, []
        if not points:
            return
        path = self.root / "series.jsonl"
        lines = "".join(json.dumps({"step": p.step, "s": round(p.seconds, 6), "phases": p.phases,
                                    "top_rank": p.top_rank, "top_phase": p.top_phase}, separators=(",", ":")) + "\n"
                        for p in points)
        with _open_append(path) as f:
            f.write(lines)
        self._series_lines += len(points)
        if self._series_lines > SERIES_LINES:  # keep the newest half: a ring on disk
            kept = path.read_text().splitlines(keepends=True)[-SERIES_LINES // 2:]
            write_private_text(path, "".join(kept))
            self._series_lines = len(kept)


def _with_caused_wait(slow: list[SlowRankEvidence], waited: list[CausedWaitJson]) -> list[SlowRankEvidence]:
    """One slow-rank per rank: a rank the others wait for (the ledger) carries that wait as its cost and the phase
    where its own work exceeds theirs; a rank only the phase comparison names keeps its phase excess."""
    by_rank = {ev["rank"]: ev for ev in slow}
    out: list[SlowRankEvidence] = []
    for c in waited:
        ev: SlowRankEvidence = {**by_rank.pop(c["rank"], {}), **c}  # the ledger's figures win
        ev["lost_ms_per_step"] = c["cost_ms_per_step"]
        ev["pct_of_step"] = c["cost_pct_of_step"]
        ev["measured_by"] = "ledger"
        out.append(ev)
    out += by_rank.values()
    return sorted(out, key=lambda a: -a["lost_ms_per_step"])


def _slow_title(ev: SlowRankEvidence) -> str:
    if ev.get("measured_by") == "ledger":
        return (f"rank {ev['rank']} makes the others wait {ev['lost_ms_per_step']:.1f} ms per step "
                f"({ev['pct_of_step']}% of the step); " + (f"it is slower in {ev['phase']}" if ev.get("phase") else
                "none of its host phases is longer (on NCCL: its GPU work is)"))
    return (f"rank {ev['rank']} is persistently slower: loses {ev['lost_ms_per_step']:.1f} ms "
            f"per step ({ev['pct_of_step']}% of the step) in {ev['phase']}")


def _phase_names(recs: list[StepRecord]) -> list[str]:
    names: dict[str, None] = {}
    for r in recs:
        names.update(dict.fromkeys(r.phases))
    return list(names)


def _record(item: object) -> StepRecord | None:
    if not isinstance(item, (list, tuple)) or len(item) != 3:
        return None
    try:
        step, secs, phases = item
        if not isinstance(phases, dict):
            return None
        return StepRecord(int(step), float(secs), {str(k): float(v) for k, v in list(phases.items())[:16]})
    except (TypeError, ValueError):
        return None


def _job_point(step: int, recs: dict[int, StepRecord]) -> JobPoint:
    ordered = sorted(recs.items(), key=lambda kv: kv[1].seconds)
    median_rec = ordered[len(ordered) // 2][1]
    top_rank, top_phase, top_s = None, None, -1.0
    for r, rec in recs.items():
        for p in LOSS_PHASES:
            v = rec.phases.get(p, 0.0)
            if v > top_s:
                top_rank, top_phase, top_s = r, p, v
    return JobPoint(step, median_rec.seconds, {k: round(v, 6) for k, v in median_rec.phases.items()},
                    top_rank, top_phase)


def _open_append(path: Path) -> IO[str]:
    """Append to a run-directory file created owner-only (0600, docs/trust.md)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "a")


def _append_line(path: Path, data: Alert) -> None:
    try:
        with _open_append(path) as f:
            f.write(json.dumps(data, separators=(",", ":"), default=str) + "\n")
    except OSError:
        pass

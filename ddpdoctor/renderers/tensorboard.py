"""The TensorBoard view: per-rank, per-step scalars written with tensorboard's own writer into RUN/scalars/rankR.

A big job (more than MAX_RANK_ROWS ranks) is written as the terminal and HTML show it (renderers/rank_classes.py):
the ranks that matter (stragglers, slowest, fastest) as rankR, and each class of alike ranks as one run,
scalars/class-<label>, holding per step the median over its ranks: a dozen curves, not a thousand."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS, group_ranks
from ddpdoctor.reports.perf_json import RankJson
from ddpdoctor.rundir.private import make_private_tree

if TYPE_CHECKING:  # the live monitor imports this module for its writer alone (live/export.py)
    from ddpdoctor.reports.sections import PerfSection

# Tag -> (per_step field, scale, description). ms because that is what people read step times in.
SCALARS: dict[str, tuple[str, float, str]] = {
    "ddpdoctor/step_time_ms": ("dur_us", 1e-3, "Duration of the profiler step (ProfilerStep#N), ms, per step."),
    "ddpdoctor/compute_ms": ("compute_us", 1e-3, "Time in the step when compute ran (union of compute "
                             "intervals), ms, per step."),
    "ddpdoctor/comm_ms": ("comm_us", 1e-3, "Time in the step when communication ran (union of collective "
                          "intervals), ms, per step."),
    "ddpdoctor/exposed_comm_ms": ("exposed_comm_us", 1e-3, "Exposed communication: communication time with no "
                                  "compute running, which the step waits for, ms, per step."),
    "ddpdoctor/overlap_pct": ("overlap_pct", 1.0, "Overlap: share of communication time hidden behind compute, "
                              "100 * |comm ∩ compute| / |comm| (HTA's definition), per step."),
}
_EVENTS_GLOB = "events.out.tfevents.*"


def _writer(logdir: Path) -> Any:
    """tensorboard's framework-free writer (no torch import); torch's SummaryWriter where it is missing. Every
    writer of ddpdoctor's comes from here, so its thread's full-disk errors never print (below)."""
    quiet_writer_thread_errors()
    try:
        from tensorboard.summary import Writer

        return Writer(str(logdir))
    except ImportError:  # tensorboard older than 2.5
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(logdir))


_previous_hook: Any = None


def quiet_writer_thread_errors() -> None:
    """tensorboard's event writer writes in a thread of its own, which re-raises a failed write (ENOSPC) and so
    printed a traceback over the job's output (the live scalars, issue 26; the report's scalars at the end of a run
    with 400 KiB free, issue 40); the same error reaches the writer's next add, flush or close in the caller's
    thread, where it is handled (the live scalars stop with a reason; a run's report says the scalars are missing).
    Only that thread's OSErrors are silenced; every other thread's errors go to the usual hook."""
    import threading

    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = threading.excepthook

    def hook(args: Any) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, OSError):
            return
        _previous_hook(args)

    threading.excepthook = hook


def _add(writer: Any, tag: str, value: float, step: int, wall: float, description: str | None) -> None:
    """One point; the tag's description goes with its first point (TensorBoard shows it next to the chart)."""
    if description is None:
        writer.add_scalar(tag, value, step, wall_time=wall)
        return
    try:
        writer.add_scalar(tag, value, step, wall_time=wall, description=description)
    except TypeError:  # torch's SummaryWriter before 2.1 has no description
        writer.add_scalar(tag, value, step, wall_time=wall)


def write_scalars(perf: PerfSection, scalars_dir: Path, wall_time: float | None = None) -> list[Path]:
    """Write one event file per rank under ``scalars_dir/rankR``; returns the rank directories written.

    Steps are the profiler's step numbers, so runs of the same script line up in TensorBoard. A rank's old
    event files are replaced: re-analysing a run must not plot each step twice.
    """
    wall = time.time() if wall_time is None else wall_time
    written: list[Path] = []
    for name, steps, about in _series(perf):
        if not steps:
            continue
        logdir = scalars_dir / name
        logdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for old in logdir.glob(_EVENTS_GLOB):
            old.unlink()
        writer = _writer(logdir)
        try:
            described: set[str] = set()
            for s in steps:
                step = s.get("step")
                for tag, (field_name, scale, desc) in SCALARS.items():
                    value = s.get(field_name)
                    # overlap_pct is null for a step without communication: write nothing rather than a fake 0.
                    if isinstance(value, (int, float)) and isinstance(step, (int, float)):
                        _add(writer, tag, float(value) * scale, int(step), wall,
                             None if tag in described else desc + about)
                        described.add(tag)
        finally:
            writer.close()
        make_private_tree(logdir)  # TensorBoard writes with the user's umask; the figures are private (0600)
        written.append(logdir)
    return written


# One run's per-step rows: a rank's recorded steps, or a class's medians (step and the scalars' fields only).
Rows = Sequence[Mapping[str, object]]


def _series(perf: PerfSection) -> list[tuple[str, Rows, str]]:
    """(run folder, per-step rows, what the run is) to write: every rank, or for a big job the ranks that matter
    and one median series per class of alike ranks."""
    # A saved report may be damaged or older: only rows with an integer rank are plotted.
    ranks = [r for r in perf.ranks or [] if isinstance(r, dict) and isinstance(r.get("rank"), int)]
    stragglers = [r for r in (perf.stragglers or {}).get("ranks") or [] if isinstance(r, int)]
    groups = group_ranks(ranks, stragglers, MAX_RANK_ROWS)
    if groups is None:
        return [(f"rank{int(r['rank'])}", r.get("per_step") or [], "") for r in ranks]
    by_rank = {int(r["rank"]): r for r in ranks}
    out: list[tuple[str, Rows, str]] = []
    singles: set[int] = set()
    for g in groups:
        if g.label in ("straggler", "slowest", "fastest", "most communication", "least communication"):
            rank = g.ranks[0]
            if rank not in singles:
                singles.add(rank)
                out.append((f"rank{rank}", by_rank[rank].get("per_step") or [], f" Rank {rank}: {g.label}."))
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", g.label.lower().replace("%", "pct")).strip("-")
        out.append((f"class-{slug}", _median_steps([by_rank[m] for m in g.ranks]),
                    f" Class {g.label}: the median over rank(s) {g.ranges} ({len(g.ranks)})."))
    return out


def _median_steps(members: list[RankJson]) -> list[dict[str, float]]:
    """Per step id, the median of each scalar's field over the ranks that recorded it (one pass over the rows)."""
    fields = [f for f, _, _ in SCALARS.values()]
    by_step: dict[int, dict[str, list[float]]] = {}
    for m in members:
        for s in m.get("per_step") or []:
            step = s.get("step")
            if not isinstance(step, int):
                continue
            cols = by_step.setdefault(step, {f: [] for f in fields})
            for f in fields:
                value = s.get(f)
                if isinstance(value, (int, float)):
                    cols[f].append(float(value))
    return [{"step": step, **{f: statistics.median(v) for f, v in cols.items() if v}}
            for step, cols in sorted(by_step.items())]

"""The TensorBoard view: per-rank, per-step scalars written with tensorboard's own writer into RUN/scalars/rankR."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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
    """tensorboard's framework-free writer (no torch import); torch's SummaryWriter where it is missing."""
    try:
        from tensorboard.summary import Writer

        return Writer(str(logdir))
    except ImportError:  # tensorboard older than 2.5
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(str(logdir))


def _add(writer: Any, tag: str, value: float, step: int, wall: float, description: str | None) -> None:
    """One point; the tag's description goes with its first point (TensorBoard shows it next to the chart)."""
    if description is None:
        writer.add_scalar(tag, value, step, wall_time=wall)
        return
    try:
        writer.add_scalar(tag, value, step, wall_time=wall, description=description)
    except TypeError:  # torch's SummaryWriter before 2.1 has no description
        writer.add_scalar(tag, value, step, wall_time=wall)


def write_scalars(sections: dict[str, Any], scalars_dir: Path, wall_time: float | None = None) -> list[Path]:
    """Write one event file per rank under ``scalars_dir/rankR``; returns the rank directories written.

    Steps are the profiler's step numbers, so runs of the same script line up in TensorBoard. A rank's old
    event files are replaced: re-analysing a run must not plot each step twice.
    """
    wall = time.time() if wall_time is None else wall_time
    written: list[Path] = []
    for rank in sections.get("ranks") or []:
        steps = rank.get("per_step") or []
        if not steps:
            continue
        logdir = scalars_dir / f"rank{int(rank['rank'])}"
        logdir.mkdir(parents=True, exist_ok=True)
        for old in logdir.glob(_EVENTS_GLOB):
            old.unlink()
        writer = _writer(logdir)
        try:
            described: set[str] = set()
            for s in steps:
                for tag, (field_name, scale, desc) in SCALARS.items():
                    value = s.get(field_name)
                    # overlap_pct is null for a step without communication: write nothing rather than a fake 0.
                    if isinstance(value, (int, float)) and s.get("step") is not None:
                        _add(writer, tag, float(value) * scale, int(s["step"]), wall,
                             None if tag in described else desc)
                        described.add(tag)
        finally:
            writer.close()
        written.append(logdir)
    return written

"""In-rank side of the live watch (ddpdoctor/live): iteration phase times for the heartbeats, checkpoint timing,
and on-demand profiler windows relayed by the monitor (`ddpdoctor capture --profile N`).

Installed by the bootstrap when a monitor watches the job; the heartbeat probe calls ``recent_steps`` for each beat
and ``on_capture_request`` for a "capture" line. Captures start and stop on the main thread at iteration
boundaries (a tracker listener), so the user's job sees them only as the profiled steps' overhead."""

from __future__ import annotations

import functools
import shutil
import threading
from pathlib import Path
from typing import Any

import torch

from ddpdoctor.live.protocol import CAPTURE_ID, MAX_PROFILE_STEPS
from ddpdoctor.probes.config import Schedule
from ddpdoctor.rundir.layout import write_json

_state: dict[str, Any] = {}  # run_dir, rank, world_size, tracker, options


def recent_steps(tracker: Any) -> list[list[Any]]:
    """The iterations finished since the last beat: [step, seconds, {phase: seconds}] rounded to microseconds."""
    return [[s, round(d, 6), {k: round(v, 6) for k, v in ph.items()}] for s, d, ph in tracker.take_recent()]


def install(run_dir: Path, rank: int, world_size: int, tracker: Any, options: dict[str, Any]) -> None:
    """Remember where captures go; time torch.save as the "checkpoint" phase (so a checkpoint step is not a stall)."""
    _state.update(run_dir=run_dir, rank=rank, world_size=world_size, tracker=tracker, options=options,
                  pending=None, window=None, lock=threading.Lock())
    tracker.add_listener(_on_step)
    from ddpdoctor.probes.heartbeat import register_request

    register_request("capture", on_capture_request)
    orig = torch.save

    @functools.wraps(orig)
    def save(*args: Any, **kwargs: Any) -> Any:
        before = tracker.phase
        tracker.phase = "checkpoint"
        try:
            return orig(*args, **kwargs)
        finally:
            tracker.phase = before

    torch.save = save


def window_dir(run_dir: Path, capture_id: str) -> Path:
    """RUN/captures/<id>: a run directory of its own (manifest, traces/, ranks/) that `analyze` reads."""
    return run_dir / "captures" / capture_id


def on_capture_request(probe: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Accept a capture request (from the heartbeat thread); the main thread starts it at the next step end."""
    rank = _state.get("rank", getattr(probe, "rank", -1))
    try:
        cid, what, steps = str(req["id"]), str(req["what"]), int(req.get("steps") or 0)
        at_step = int(req.get("at_step") or 0)
    except (ValueError, KeyError, TypeError):
        return {"type": "capture", "rank": rank, "accepted": False, "reason": "malformed request"}
    reply = {"type": "capture", "rank": rank, "id": cid, "what": what}
    if not _state or not CAPTURE_ID.match(cid):
        return dict(reply, accepted=False, reason="live capture not installed" if not _state else "bad id")
    if what == "profile" and _state["options"].get("mode") == "profile":
        return dict(reply, accepted=False, reason="`ddpdoctor profile` already runs the profiler in this job")
    if what != "profile" or not 1 <= steps <= MAX_PROFILE_STEPS:
        return dict(reply, accepted=False, reason=f"unknown capture {what!r} or steps not in 1..{MAX_PROFILE_STEPS}")
    with _state["lock"]:
        if _state["pending"] is not None or _state["window"] is not None:
            return dict(reply, accepted=False, reason="a capture is already in progress")
        _state["pending"] = (cid, what, steps, at_step)
    return dict(reply, accepted=True)


def _on_step(step: int) -> None:
    # Main thread, at an iteration boundary: cheap unless a capture is pending or running.
    if _state.get("pending") is None and _state.get("window") is None:
        return
    try:
        _advance(step)
    except Exception as exc:  # noqa: BLE001 - a capture never changes how the user's job runs
        win = _state.get("window") or {}
        _state["window"] = _state["pending"] = None
        if win.get("dir") is not None:
            write_json(win["dir"] / "ranks" / f"rank{_state['rank']}" / "done.json", {"error": repr(exc)})


def _advance(step: int) -> None:
    win = _state["window"]
    if win is None:
        cid, what, steps, at_step = _state["pending"]
        if step < at_step:
            return  # every rank starts on the iteration the monitor chose
        out = window_dir(_state["run_dir"], cid)
        win = {"id": cid, "what": what, "steps": steps, "base": step, "dir": out}
        rank_dir = out / "ranks" / f"rank{_state['rank']}"
        rank_dir.mkdir(parents=True, exist_ok=True)
        info = _state["run_dir"] / "ranks" / f"rank{_state['rank']}" / "info.json"
        if info.is_file():
            shutil.copyfile(info, rank_dir / "info.json")
        from ddpdoctor.probes.profiler import ProfilerProbe

        # One warm-up step (the profiler's own start-up cost), then the N steps asked for.
        win["probe"] = ProfilerProbe(out / "traces", _state["rank"], Schedule(wait=0, warmup=1, active=steps),
                                     record_shapes=True, with_stack=False)
        win["probe"].start()
        _state["window"], _state["pending"] = win, None
        return
    k = step - win["base"]
    win["probe"].on_step(k)
    if not win["probe"].written and k <= win["steps"] + 1:
        return
    win["probe"].finish()
    _summarise(win)
    write_json(win["dir"] / "ranks" / f"rank{_state['rank']}" / "done.json",
               {"first_step": win["base"] + 1, "last_step": step})
    _state["window"] = None


def _summarise(win: dict[str, Any]) -> None:
    written = win["probe"].written
    if not written:
        return
    from ddpdoctor.traces.summary import summarize_trace_files

    summary = summarize_trace_files(written, rank=_state["rank"])
    write_json(win["dir"] / "ranks" / f"rank{_state['rank']}" / "summary.json", summary)



def finish(status: dict[str, Any]) -> None:
    """The script ended inside a capture window: write what was recorded (the bootstrap calls this)."""
    win = _state.get("window")
    _state["window"] = _state["pending"] = None
    if win is not None:
        win["probe"].finish()
        _summarise(win)
        write_json(win["dir"] / "ranks" / f"rank{_state['rank']}" / "done.json",
                   {"first_step": win["base"] + 1, "last_step": status.get("steps_completed"), "cut_short": True})

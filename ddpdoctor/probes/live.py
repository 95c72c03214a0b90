"""In-rank side of the live watch (ddpdoctor/live): iteration phase times for the heartbeats, checkpoint timing,
and on-demand windows relayed by the monitor (`ddpdoctor capture --profile N | --check-sync N`).

Installed by the bootstrap when a monitor watches the job; the heartbeat probe calls ``recent_steps`` for each beat
and ``on_capture_request`` for a "capture" line. Captures start and stop on the main thread at iteration
boundaries (a tracker listener), so the user's job sees them only as the profiled steps' overhead."""

from __future__ import annotations

import functools
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ddpdoctor.live.protocol import CAPTURE_ID, MAX_STEPS, WINDOW_KINDS
from ddpdoctor.probes.config import ProbeOptions, Schedule
from ddpdoctor.probes.records import CaptureReply, RankStatusDoc
from ddpdoctor.rundir.layout import write_json


@dataclass
class _Window:
    """A capture window this rank is recording: its id, kind, length, the step it began after, where it goes."""

    id: str
    what: str  # "profile" or "check-sync"
    steps: int
    base: int
    dir: Path
    rank: int
    probe: Any = None  # ProfilerProbe or SyncProbe
    hooks: list[tuple[dict[Any, Any], Any]] = field(default_factory=list)  # check-sync: the hooks it added


@dataclass
class _Live:
    """Where captures go and what is under way; set by ``install`` (one per rank process)."""

    run_dir: Path
    rank: int
    world_size: int
    tracker: Any
    options: ProbeOptions  # the probe options and the launch's mode
    ddp_modules: Callable[[], list[Any]]
    lock: threading.Lock = field(default_factory=threading.Lock)
    pending: tuple[str, str, int, int] | None = None  # (id, what, steps, at_step): asked for, not started yet
    window: _Window | None = None


_live: _Live | None = None


def recent_steps(tracker: Any) -> list[list[Any]]:
    """The iterations finished since the last beat: [step, seconds, {phase: seconds}] rounded to microseconds."""
    return [[s, round(d, 6), {k: round(v, 6) for k, v in ph.items()}] for s, d, ph in tracker.take_recent()]


def install(run_dir: Path, rank: int, world_size: int, tracker: Any, options: ProbeOptions,
            ddp_modules: Callable[[], list[Any]] = list) -> None:
    """Remember where captures go; time torch.save as the "checkpoint" phase (so a checkpoint step is not a stall).
    ``ddp_modules``: the job's live DDP modules (for check-sync windows)."""
    global _live
    _live = _Live(run_dir=run_dir, rank=rank, world_size=world_size, tracker=tracker, options=options,
                  ddp_modules=ddp_modules)
    tracker.add_listener(_on_step)
    from ddpdoctor.probes.requests import register_request

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


# req: the monitor's capture message as it arrived (raw JSON in), checked here
def on_capture_request(probe: Any, req: dict[str, Any]) -> CaptureReply:
    """Accept a capture request (from the heartbeat thread); the main thread starts it at the chosen step end."""
    state = _live
    rank = state.rank if state is not None else getattr(probe, "rank", -1)
    try:
        cid, what, steps = str(req["id"]), str(req["what"]), int(req.get("steps") or 0)
        at_step = int(req.get("at_step") or 0)
    except (ValueError, KeyError, TypeError):
        return {"type": "capture", "rank": rank, "accepted": False, "reason": "malformed request"}
    reply: CaptureReply = {"type": "capture", "rank": rank, "id": cid, "what": what}
    if state is None or not CAPTURE_ID.match(cid):
        return {**reply, "accepted": False, "reason": "live capture not installed" if state is None else "bad id"}
    mode = state.options.get("mode")
    if (what, mode) in (("profile", "profile"), ("check-sync", "check-sync")):
        return {**reply, "accepted": False, "reason": f"`ddpdoctor {mode}` already does this in this job"}
    if what not in WINDOW_KINDS or not 1 <= steps <= MAX_STEPS:
        return {**reply, "accepted": False, "reason": f"unknown capture {what!r} or steps not in 1..{MAX_STEPS}"}
    with state.lock:
        if state.pending is not None or state.window is not None:
            return {**reply, "accepted": False, "reason": "a capture is already in progress"}
        state.pending = (cid, what, steps, at_step)
    return {**reply, "accepted": True}


def _on_step(step: int) -> None:
    # Main thread, at an iteration boundary: cheap unless a capture is pending or running.
    state = _live
    if state is None or (state.pending is None and state.window is None):
        return
    try:
        _advance(state, step)
    except Exception as exc:  # noqa: BLE001 - a capture never changes how the user's job runs
        win = state.window
        state.window = state.pending = None
        if win is not None:
            if win.probe is not None:
                _close(win)
            write_json(win.dir / "ranks" / f"rank{state.rank}" / "done.json", {"error": repr(exc)})


def _advance(state: _Live, step: int) -> None:
    win = state.window
    if win is None:
        assert state.pending is not None  # _on_step comes here only with one of them set
        cid, what, steps, at_step = state.pending
        if step < at_step:
            return  # every rank starts on the iteration the monitor chose
        state.window, state.pending = _open(state, cid, what, steps, step), None
        return
    k = step - win.base
    if win.what == "profile":
        win.probe.on_step(k)
        if not win.probe.written and k <= win.steps + 1:
            return
    else:
        win.probe.on_step(step)
        if k < win.steps:
            return
    _close(win)
    write_json(win.dir / "ranks" / f"rank{state.rank}" / "done.json",
               {"first_step": win.base + 1, "last_step": step})
    state.window = None


def _open(state: _Live, cid: str, what: str, steps: int, step: int) -> _Window:
    out = window_dir(state.run_dir, cid)
    win = _Window(id=cid, what=what, steps=steps, base=step, dir=out, rank=state.rank)
    rank_dir = out / "ranks" / f"rank{state.rank}"
    rank_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = state.run_dir / "ranks" / f"rank{state.rank}" / "info.json"
    if info.is_file():
        shutil.copyfile(info, rank_dir / "info.json")
    if what == "profile":
        from ddpdoctor.probes.profiler import ProfilerProbe

        # One warm-up step (the profiler's own start-up cost), then the N steps asked for.
        win.probe = ProfilerProbe(out / "traces", state.rank, Schedule(wait=0, warmup=1, active=steps),
                                  record_shapes=True, with_stack=False)
        win.probe.start()
        return win
    from ddpdoctor.probes.sync import SyncProbe
    from ddpdoctor.rundir.layout import RunDir

    # steps=0: the probe never stops the job; this window ends it after N iterations instead.
    probe = SyncProbe(RunDir(out), state.rank, state.world_size, {"steps": 0}, state.tracker)
    probe.install()
    win.probe = probe
    for ddp in state.ddp_modules():
        # The DDP modules exist already: watch them, remembering the hooks added so the window can remove them.
        before = {id(d): set(d) for d in _hook_dicts(ddp)}
        probe._watch(ddp)
        win.hooks += [(d, key) for d in _hook_dicts(ddp) for key in set(d) - before[id(d)]]
    return win


def _hook_dicts(ddp: Any) -> list[dict[Any, Any]]:
    return [ddp._forward_pre_hooks, ddp._forward_hooks, ddp.module._forward_pre_hooks]


def _close(win: _Window) -> None:
    if win.what == "profile":
        win.probe.finish()
        _summarise(win)
        return
    for hooks, key in win.hooks:
        hooks.pop(key, None)
    win.probe.finish({})


def _summarise(win: _Window) -> None:
    written = win.probe.written
    if not written:
        return
    from ddpdoctor.analyses.summary import summarize_trace_files

    summary = summarize_trace_files(written, rank=win.rank)
    write_json(win.dir / "ranks" / f"rank{win.rank}" / "summary.json", summary)


def finish(status: RankStatusDoc) -> None:
    """The script ended inside a capture window: write what was recorded (the bootstrap calls this)."""
    state = _live
    if state is None:
        return
    win = state.window
    state.window = state.pending = None
    if win is not None:
        _close(win)
        write_json(win.dir / "ranks" / f"rank{win.rank}" / "done.json",
                   {"first_step": win.base + 1, "last_step": status.get("steps_completed"), "cut_short": True})

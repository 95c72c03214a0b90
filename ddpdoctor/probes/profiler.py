"""Runs torch.profiler on a schedule inside a rank, advanced by the StepTracker, writing into RUN/traces."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from ddpdoctor.probes.config import Schedule

# How long a stop waits at most for the communication threads to go idle (see settle_comm_threads).
SETTLE_MAX_S = 0.2


def _busy_threads(me: int) -> int:
    """Threads of this process, other than ``me``, that are running or runnable (state R in /proc)."""
    busy = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        if tid == str(me):
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue  # the thread ended
        fields = stat.rsplit(b")", 1)[-1].split()
        if fields and fields[0] == b"R":
            busy += 1
    return busy


def settle_comm_threads(max_s: float = SETTLE_MAX_S) -> float:
    """Wait (at most ``max_s``) until no other thread of this rank is running; return the seconds waited.

    Why: gloo completes a collective's future *before* its worker thread ends the collective's profiler event
    (``AsyncWork::finishWorkGloo``: ``markCompleted`` then ``finish()``, which runs the RecordFunction end callback).
    DDP's backward returns on the future, so the iteration can end, and the profiler be stopped, while a worker
    thread still writes that event into the profiler's per-thread buffers, which the stop is reading and freeing: a
    heap corruption that aborts the rank (seen as ``malloc(): unsorted double linked list corrupted`` in
    ``_trace_ready``, rarely, on a loaded machine). The window between the two is microseconds, unless the worker is
    preempted; waiting for the rank's threads to go idle (gloo's workers then sleep on their queue) closes it.
    Costs one /proc scan (~0.1 ms) when idle, at most ``max_s`` once per profile window."""
    me = threading.get_native_id()
    start = time.perf_counter()
    time.sleep(0)  # let a runnable worker take the GIL-free CPU first
    while _busy_threads(me) and time.perf_counter() - start < max_s:
        time.sleep(0.001)
    return time.perf_counter() - start


class ProfileWindowDone(SystemExit):
    """Raised from the iteration boundary after the window is written, when the rank should stop (the default of
    `profile`): every rank reaches the same iteration, so all stop together, outside any collective."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


class ProfilerProbe:
    """Owns one torch.profiler.profile. ``on_step`` advances it; ``finish`` writes what was recorded.

    Traces are named ``rankR.<ts>.pt.trace.json.gz`` in RUN/traces, which TensorBoard's profiler
    plugin reads as run "traces" with one worker per rank."""

    def __init__(self, trace_dir: Path, rank: int, schedule: Schedule, record_shapes: bool, with_stack: bool,
                 stop_after_window: bool = False):
        self.trace_dir = trace_dir
        self.stop_after_window = stop_after_window
        self.rank = rank
        self.schedule = schedule
        self.written: list[Path] = []
        self.settled_s = 0.0  # time spent letting communication threads finish before a stop
        self._done = False
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=schedule.wait, warmup=schedule.warmup, active=schedule.active, repeat=schedule.repeat
            ),
            on_trace_ready=self._trace_ready,
            record_shapes=record_shapes,
            with_stack=with_stack,
        )
        self._last_step = schedule.recorded_steps()[-1] + 1 if schedule.active > 0 else 0
        self._first_recorded = schedule.wait + schedule.warmup  # the ProfilerStep number recording begins at
        self._adaptive = None
        if schedule.auto and schedule.repeat <= 1:
            from ddpdoctor.probes.window import AdaptiveWindow

            self._adaptive = AdaptiveWindow(rank, schedule.min_active)

    def start(self) -> None:
        self._prof.start()

    def on_step(self, step: int) -> None:
        if self._done:
            return
        if self._adaptive is not None:
            # Iteration ``step`` is ProfilerStep step-1. Decide before stepping the profiler, so that a stop closes
            # that step at its natural end (no partial step in the trace).
            if step == self._first_recorded:
                self._adaptive.tick()
            elif step > self._first_recorded and self._adaptive.should_stop(step):
                self._stop(step)
                return
        if self._stops_recording():
            self.settled_s += settle_comm_threads()
        self._prof.step()
        if step > self._last_step:
            # The schedule is over: stop the profiler so later steps pay nothing for it.
            self._stop(step)

    def _stops_recording(self) -> bool:
        """Will the next profiler step end a recording (and so read and free its event buffers)?"""
        try:
            action = torch.profiler.ProfilerAction
            prof: Any = self._prof
            now, nxt = prof.current_action, prof.schedule(prof.step_num + 1)
            return bool(now == action.RECORD_AND_SAVE or (now == action.RECORD and nxt != action.RECORD
                                                               and nxt != action.RECORD_AND_SAVE))
        except Exception:  # noqa: BLE001 - another torch's profiler internals: settle every step of the window
            return True

    def _stop(self, step: int) -> None:
        self.finish()
        if self.stop_after_window and self.written:
            raise ProfileWindowDone(step)

    def _trace_ready(self, prof: Any) -> None:
        self.trace_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        before = set(self.trace_dir.glob(f"rank{self.rank}.*.pt.trace.json.gz"))
        handler = torch.profiler.tensorboard_trace_handler(
            str(self.trace_dir), worker_name=f"rank{self.rank}", use_gzip=True
        )
        try:
            handler(prof)
        except OSError:
            # A full disk (or quota) must not end the user's job: drop the half-written trace, keep training.
            for partial in set(self.trace_dir.glob(f"rank{self.rank}.*.pt.trace.json.gz")) - before:
                partial.unlink(missing_ok=True)
            return
        after = set(self.trace_dir.glob(f"rank{self.rank}.*.pt.trace.json.gz"))
        # Kineto writes with the user's umask (0644); the launcher's final chmod runs on the head node only, so
        # the trace is made 0600 here, where it is written, on every node (issue 40 item 9).
        from ddpdoctor.rundir.private import make_private_file

        for path in after - before:
            make_private_file(path)
        self.written.extend(sorted(after - before))

    def finish(self) -> None:
        """Stop the profiler; a window still recording is written (the script ended early, or crashed)."""
        if self._done:
            return
        self._done = True
        try:
            self.settled_s += settle_comm_threads()
            self._prof.stop()
        except Exception:  # noqa: BLE001 - never let the probe hide the user's own exit status
            pass

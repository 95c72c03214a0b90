"""Progress while work runs, on stderr and only on a terminal (never under --json, in CI logs or a pipe): ranks
connected, steps seen per rank, the profiling window, analysing and merging by bytes."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

CI_VARS = ("CI", "GITHUB_ACTIONS", "GITLAB_CI", "BUILDKITE", "JENKINS_URL", "TF_BUILD")
STEP_LINE_EVERY_S = 5.0


def enabled(as_json: bool = False, stream: Any = None) -> bool:
    """Progress is for a person watching a terminal: off under --json, off when stderr is not a TTY, off in CI."""
    stream = sys.stderr if stream is None else stream
    if as_json or os.environ.get("DDPDOCTOR_PROGRESS") == "0":
        return False
    if os.environ.get("DDPDOCTOR_PROGRESS") == "1":  # tests and users who want it in a pipe
        return True
    if any(os.environ.get(v) for v in CI_VARS) or os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def bar(description: str, total: int | None, on: bool, unit: str = "") -> Iterator[Callable[[int], None]]:
    """A transient bar on stderr (bytes shown as MB when ``unit`` is "MB"); a no-op callable when off."""
    if not on:
        yield _nothing
        return
    # rich only when a bar is shown: under --json or in a pipe its imports were a tenth of analysing one trace.
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    con = Console(stderr=True, force_terminal=os.environ.get("DDPDOCTOR_PROGRESS") == "1" or None)
    count = DownloadColumn() if unit == "MB" else TextColumn("{task.completed}/{task.total}")
    progress = Progress(TextColumn("{task.description}"), BarColumn(), count, TimeElapsedColumn(), console=con,
                        transient=True)
    with progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _nothing(n: int) -> None:
    return None


def say(text: str, on: bool) -> None:
    if on:
        sys.stderr.write(f"ddpdoctor: {text}\n")
        sys.stderr.flush()


def rank_steps(link: Any) -> int:
    """Steps a rank has been seen to finish: its heartbeat's step, its last collective's, or its exit report's."""
    get = link.get if isinstance(link, dict) else lambda key: getattr(link, key, None)
    beat = get("beat") or {}
    exit_ = get("exit") or {}
    coll = beat.get("collective") or {}
    values = [beat.get("step"), coll.get("step") if isinstance(coll, dict) else None, exit_.get("steps_completed")]
    return max([v for v in values if isinstance(v, int)] or [0])


class LaunchProgress:
    """Wraps the job's watcher (the heartbeat monitor) and prints, as they change: ranks connected, steps seen
    per rank (every few seconds), the profiling window recording and written. Everything else is delegated, so
    callers keep using the monitor through it."""

    def __init__(self, inner: Any, *, window: tuple[int, int] | None = None, world: int | None = None) -> None:
        self.inner = inner
        self.window = window  # (first, last) profiled step, as the profiler numbers them (ProfilerStep#N)
        self.world = world
        self.spec: Any = None
        self._said: set[str] = set()
        self._last_steps = float("-inf")
        self._steps_shown: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (copy, pickle): never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    def start(self, spec: Any) -> str | None:
        self.spec = spec
        world = self.world or "?"
        say(f"starting {world} rank(s); run directory {spec.run_dir.root}", True)
        return self.inner.start(spec) if self.inner is not None else None

    def check(self, job: Any) -> None:
        if self.inner is not None:
            self.inner.check(job)
        self.update(time.monotonic())

    def stop(self, job: Any) -> None:
        if self.inner is not None:
            self.inner.stop(job)
        self.update(time.monotonic(), final=True)

    def _once(self, key: str, text: str) -> None:
        if key not in self._said:
            self._said.add(key)
            say(text, True)

    def update(self, now: float, final: bool = False) -> None:
        links = dict(getattr(self.inner, "links", {}) or {})
        world = getattr(self.inner, "world_size", None) or self.world
        if links:
            total = world or len(links)
            self._once(f"connected-{len(links)}", f"{len(links)}/{total} rank(s) connected")
        steps = {r: rank_steps(lk) for r, lk in sorted(links.items())}
        if steps and steps != self._steps_shown and (final or now - self._last_steps >= STEP_LINE_EVERY_S):
            self._last_steps, self._steps_shown = now, steps
            shown = list(steps.items())
            text = ", ".join(f"rank {r} {n}" for r, n in shown[:8]) + (f", … {len(shown) - 8} more" if len(shown) > 8
                                                                         else "")
            say(f"steps seen: {text}", True)
        if self.window and steps:
            first, last = self.window
            if min(steps.values()) >= first and max(steps.values()) <= last:
                self._once("recording", f"profiling: recording steps {first}-{last}")
            if self.spec is not None:
                traces = self.spec.run_dir.trace_files()
                if traces:
                    self._once(f"written-{len(traces)}", f"profiling: {len(traces)} trace(s) written")


def with_progress(watcher: Any, spec_torchrun: Mapping[str, object], as_json: bool,
                  schedule: Any = None) -> Any:
    """The watcher, wrapped to print launch progress when progress is on (else unchanged)."""
    if not enabled(as_json):
        return watcher
    nproc, nnodes = str(spec_torchrun.get("--nproc-per-node", "1")), str(spec_torchrun.get("--nnodes", "1"))
    world = int(nproc) * int(nnodes) if nproc.isdigit() and nnodes.isdigit() else None
    window = None
    active = getattr(schedule, "active", None)
    if schedule is not None and isinstance(active, int) and active > 0:
        first = schedule.wait + schedule.warmup  # ProfilerStep#N numbers: the profiler counts from 0
        window = (first, first + active - 1)
    return LaunchProgress(watcher, window=window, world=world)

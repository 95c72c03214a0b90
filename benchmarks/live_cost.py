"""What the live health watch costs: in the rank (the phase clock on every phase change, the per-iteration record,
its share of the heartbeat) and in the monitor (ingest and rules per second of a job), without a job.

    python benchmarks/live_cost.py [--iterations 20000] [--ranks 8,1024]

The rank-side figure is per training iteration, in microseconds and as % of a 10 ms and a 100 ms step (the run
overhead budget is 0.5%). The end-to-end comparison with plain torchrun is benchmarks/overhead.py --command run."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _old_tracker() -> type:
    """The StepTracker before the live watch (git main's steps.py, or None when git has no such revision)."""
    import importlib.util
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", "ce5fc87:ddpdoctor/probes/steps.py"], cwd=repo, capture_output=True,
                         text=True).stdout
    if not src:
        raise SystemExit("git revision ce5fc87 (before the live watch) not found: run from a clone")
    path = Path(tempfile.mkdtemp()) / "old_steps.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("old_steps", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.StepTracker  # type: ignore[no-any-return]


def rank_side_us(iterations: int, rounds: int = 5) -> tuple[float, float, float]:
    """(µs per iteration of the old tracker, of the new one, of serialising the records into beats); the hooks
    of one DDP iteration replayed, old and new alternated, best of ``rounds``."""
    from ddpdoctor.probes.live import recent_steps
    from ddpdoctor.probes.steps import StepTracker

    def replay(tracker: object, n: int, live: bool) -> float:
        t: Any = tracker
        t0 = time.perf_counter()
        for _ in range(n):
            # data -> forward -> backward -> other (a blocking collective) -> optimizer -> end of iteration
            t.phase = "forward"
            t.phase = "backward"
            t.phase = "other"
            if live:
                t.collective_started()
                t.collective_ended()
            t.phase = "optimizer"
            t.explicit_step()
            if live and len(t.recent) == t.recent.maxlen:
                t.take_recent()
        return (time.perf_counter() - t0) / n * 1e6

    old_cls = _old_tracker()
    old, new = [], []
    for _ in range(rounds):
        old.append(replay(old_cls(), iterations, False))
        new.append(replay(StepTracker(), iterations, True))
    tracker = StepTracker()
    replay(tracker, 64, True)
    t0 = time.perf_counter()
    for _ in range(200):
        tracker.recent.extend([(1, 0.1, {"forward": 0.03, "backward": 0.05, "optimizer": 0.01, "data": 0.01})] * 64)
        recent_steps(tracker)
    beat = (time.perf_counter() - t0) / (200 * 64) * 1e6
    return min(old), min(new), beat


def messages_us(n: int = 20000, rounds: int = 5) -> tuple[float, float]:
    """(µs to build and send the "backward" line a rank sends on entering backward() once per iteration, and the
    "enter" line of a blocking collective), over a local socket whose other end a thread drains; best of ``rounds``."""
    import socket
    import threading
    from types import SimpleNamespace

    from ddpdoctor.probes.heartbeat_lines import backward_line, enter_line

    a, b = socket.socketpair()
    threading.Thread(target=lambda: [None for _ in iter(lambda: b.recv(1 << 16), b"")], daemon=True).start()
    tracker = SimpleNamespace(step=1234, step_started=time.time())
    state = {"op": "all_reduce", "group": "default_pg", "seq": 17, "sizes": [[1024]], "call_site": "/job/train.py:88",
             "since": time.time(), "step": 1234}

    def timed(make: Any) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            a.sendall(make())
        return (time.perf_counter() - t0) / n * 1e6

    bwd = min(timed(lambda: backward_line("/job/train.py:91", time.time(), tracker)) for _ in range(rounds))
    enter = min(timed(lambda: enter_line(state)) for _ in range(rounds))
    a.close()
    return bwd, enter


def monitor_side(ranks: int, steps: int) -> tuple[float, float]:
    """(seconds of monitor CPU per job step for ``ranks`` ranks: ingest + one tick per step, bytes of a beat)."""
    import json

    from ddpdoctor.live.health import LiveHealth

    with tempfile.TemporaryDirectory() as tmp:
        health = LiveHealth(Path(tmp), world_size=ranks, eval_interval_s=0.0)
        rec = {"data": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01}
        t0 = time.process_time()
        for s in range(1, steps + 1):
            for r in range(ranks):
                health.ingest(r, [[s, 0.1, rec]])
            health.tick(now=float(s))
        cpu = (time.process_time() - t0) / steps
        beat = len(json.dumps([[1, 0.1, rec]]))
    return cpu, beat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=20000)
    ap.add_argument("--ranks", default="8,1024")
    a = ap.parse_args()
    old, new, beat = rank_side_us(a.iterations)
    main_thread = new - old
    print(f"rank side, main thread: tracker hooks {old:.2f} us/iteration before, {new:.2f} us with the phase clock "
          f"(+{main_thread:.2f} us = {main_thread / 100:.3f}% of a 10 ms step, {main_thread / 1000:.4f}% of 100 ms)")
    print(f"rank side, heartbeat thread: {beat:.2f} us/iteration to serialise its record into a beat "
          f"({beat / 100:.3f}% of a 10 ms step)")
    bwd, enter = messages_us()
    print(f"rank side, main thread: the backward() message {bwd:.2f} us/iteration ({bwd / 100:.3f}% of a 10 ms step); "
          f"a blocking collective's enter message, the peer it copies, {enter:.2f} us each")
    for n in (int(x) for x in a.ranks.split(",")):
        steps = 60 if n <= 64 else 40
        cpu, size = monitor_side(n, steps)
        print(f"monitor, {n} ranks: {cpu * 1e3:.2f} ms CPU per job step with a rules pass every step "
              f"(the monitor runs them once a second); {size} bytes per iteration record in a beat")


if __name__ == "__main__":
    main()

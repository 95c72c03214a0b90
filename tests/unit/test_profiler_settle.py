"""The profiler's stop waits for the rank's other threads to go idle (probes/profiler.settle_comm_threads): gloo ends
a collective's profiler event on its worker thread after DDP's backward has returned on the collective's future."""

from __future__ import annotations

import threading
import time

from ddpdoctor.probes.profiler import SETTLE_MAX_S, settle_comm_threads


def _spin(seconds: float, done: threading.Event) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass  # runnable the whole time: state R in /proc
    done.set()


def test_waits_while_another_thread_runs_then_returns():
    done = threading.Event()
    worker = threading.Thread(target=_spin, args=(0.08, done))
    worker.start()
    try:
        waited = settle_comm_threads()
        # It returned because the spinning thread ended, or because the cap was reached: never before either.
        assert done.is_set() or waited >= SETTLE_MAX_S
    finally:
        worker.join()


def test_never_waits_past_its_cap():
    done = threading.Event()
    worker = threading.Thread(target=_spin, args=(2.0, done))
    worker.start()
    try:
        waited = settle_comm_threads(max_s=0.1)
        assert 0.1 <= waited < 1.5 and not done.is_set()
    finally:
        worker.join()

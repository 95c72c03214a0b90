"""The profiler's stop waits for the rank's other threads to go idle (probes/profiler.settle_comm_threads): gloo ends
a collective's profiler event on its worker thread after DDP's backward has returned on the collective's future."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ddpdoctor.probes.profiler import SETTLE_MAX_S, settle_comm_threads


@contextmanager
def spinning(seconds: float) -> Iterator[threading.Event]:
    """Another thread runnable the whole time (state R in /proc) for ``seconds``; the event is set when it ends."""
    done = threading.Event()

    def spin() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        done.set()

    worker = threading.Thread(target=spin)
    worker.start()
    try:
        yield done
    finally:
        worker.join()


def test_waits_while_another_thread_runs_then_returns():
    with spinning(0.08) as done:
        waited = settle_comm_threads()
        # It returned because the spinning thread ended, or because the cap was reached: never before either.
        assert done.is_set() or waited >= SETTLE_MAX_S


def test_never_waits_past_its_cap():
    with spinning(2.0) as done:
        waited = settle_comm_threads(max_s=0.1)
        assert 0.1 <= waited < 1.5 and not done.is_set()

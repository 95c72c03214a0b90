"""The adaptive profile window (`--active auto`): record until the step-time interval is within ±10%, with a cap.

Every rank must stop recording (and, by default, training) at the same iteration, or one would wait in a collective
for a rank that left: rank 0 decides from its own step times and publishes the decision for each iteration in the
job's c10d store; the others wait for it there (a store round trip per recorded step, outside any collective)."""

from __future__ import annotations

import math
import statistics
import time
from datetime import timedelta
from typing import Any

# Converged when the 90% interval of the mean step time is within ±10% of it.
TOLERANCE = 0.10
# How long a rank waits for rank 0's decision before it keeps recording on its own (rank 0 gone: the watch says why).
DECISION_TIMEOUT_S = 120.0
Z90 = 1.645


def converged(durations: list[float], min_steps: int, tolerance: float = TOLERANCE) -> bool:
    """Enough steps, and the 90% interval of the mean step time (normal approximation: 1.645 s/√n, cheap enough
    to run inside a recorded step) within ±tolerance of the mean."""
    n = len(durations)
    if n < max(3, min_steps):
        return False
    mean = statistics.fmean(durations)
    return mean > 0 and Z90 * statistics.stdev(durations) / math.sqrt(n) <= tolerance * mean


def _store() -> Any:
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store: this rank decides alone (one process)
        return None


class AdaptiveWindow:
    """Fed each recorded iteration's duration; says when to stop, the same answer on every rank."""

    def __init__(self, rank: int, min_steps: int) -> None:
        self.rank = rank
        self.min_steps = min_steps
        self.durations: list[float] = []
        self._last: float | None = None

    def tick(self) -> None:
        """An iteration ended before recording began: only restart the clock."""
        self._last = time.perf_counter()

    def should_stop(self, iteration: int) -> bool:
        now = time.perf_counter()
        if self._last is not None:
            self.durations.append(now - self._last)
        self._last = now
        mine = converged(self.durations, self.min_steps)
        store = _store()
        if store is None:
            return mine
        key = f"ddpdoctor/window/{iteration}"
        try:
            if self.rank == 0:
                store.set(key, b"1" if mine else b"0")
                return mine
            store.wait([key], timedelta(seconds=DECISION_TIMEOUT_S))
            return bytes(store.get(key)) == b"1"
        except Exception:  # noqa: BLE001 - without rank 0's word, keep recording to the cap (never stop alone)
            return False
        finally:
            self._last = time.perf_counter()  # the store round trip is not part of the next step's time

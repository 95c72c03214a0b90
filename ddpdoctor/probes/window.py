"""The adaptive profile window (`--active auto`): record until the step-time interval is within ±10%, with a cap.

Every rank must stop recording (and, by default, training) at the same iteration, or one would wait in a collective
for a rank that left: every CHECK_EVERY recorded steps, rank 0 decides from its own step times and publishes the
decision in the job's c10d store; every rank acts on it one iteration later. Why the lag: had the others waited for
the decision of the iteration they just ended, they would start that step a store round trip after rank 0 and arrive
last at its collectives: a straggler made by the probe. One iteration later the key is already there (rank 0 wrote
it before the collectives of the iteration just ended), so each rank pays one round trip per check, rank 0 for its
write and the others for their read, outside any collective."""

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
# Rank 0 checks convergence every 5 recorded steps, not every step: each check costs one store round trip on rank 0
# (its write) and, one iteration later, on the others (their read), just before the collectives that follow the
# optimizer step; checked every step, that delay on the same ranks made them last at most of those collectives, a
# straggler the probe made (seen on a healthy 2-rank job). At most 4 more steps are recorded than needed.
CHECK_EVERY = 5
# Recording stops early only from 10 recorded steps on, whatever the minimum a script must reach (AUTO_MIN, 5): a
# window that stopped at 5-6 steps left the step-time rules of a healthy 2-rank job undecided (a cv of 0.3 with
# an interval from 0.0 to 0.4), where the 16-20 steps of the other profiles decided them.
EARLY_STOP_MIN = 10


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
        self._decided: tuple[int, bool] | None = None  # (iteration checked, rank 0's decision) not yet acted on

    def tick(self) -> None:
        """An iteration ended before recording began: only restart the clock."""
        self._last = time.perf_counter()

    def should_stop(self, iteration: int) -> bool:
        """Whether to stop at this iteration: rank 0's decision from the previous iteration, when that one was a
        check (every CHECK_EVERY recorded steps); False otherwise."""
        now = time.perf_counter()
        if self._last is not None:
            self.durations.append(now - self._last)
        self._last = now
        previous, self._decided = self._decided, None
        try:
            if previous is not None:
                return self._decision(previous)
            if len(self.durations) % CHECK_EVERY == 0:
                self._decided = (iteration, converged(self.durations, max(self.min_steps, EARLY_STOP_MIN)))
                if self.rank == 0 and (store := _store()) is not None:
                    store.set(_key(iteration), b"1" if self._decided[1] else b"0")
            return False
        except Exception:  # noqa: BLE001 - without rank 0's word, keep recording to the cap (never stop alone)
            return False
        finally:
            self._last = time.perf_counter()  # the store round trip is not part of the next step's time

    def _decision(self, decided: tuple[int, bool]) -> bool:
        store = _store()
        if store is None or self.rank == 0:
            return decided[1]
        return _read_decision(store, _key(decided[0])) == b"1"


def _read_decision(store: Any, key: str) -> bytes:
    """The decision under ``key`` in one store round trip, as rank 0 pays one for its write: ``compare_set`` with
    an expected value that is never stored reads without blocking (a missing key returns the expected value and
    sets nothing). A ``wait`` then ``get`` would cost two, and that second round trip alone, ~0.1 ms a step, made
    the other ranks last at a 2 ms step's collectives. Only when the key is not there yet (rank 0 behind, or a
    script without collectives) does the rank wait for it."""
    try:
        value = bytes(store.compare_set(key, _ABSENT, _ABSENT))
        if value != _ABSENT:
            return value
    except Exception:  # noqa: BLE001 - a store without compare_set: wait and read
        pass
    store.wait([key], timedelta(seconds=DECISION_TIMEOUT_S))
    return bytes(store.get(key))


_ABSENT = b"?"


def _key(iteration: int) -> str:
    return f"ddpdoctor/window/{iteration}"

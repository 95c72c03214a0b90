"""The in-script API: ``ddpdoctor.step()`` and ``with ddpdoctor.iteration():``. No-ops outside ddpdoctor."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ddpdoctor.probes import steps


def step() -> None:
    """End the current training iteration.

    For loops without an optimizer, or loops whose iterations ddpdoctor cannot see. The first call
    switches this rank to explicit stepping: optimizer steps no longer end iterations, so an iteration
    is never counted twice."""
    tracker = steps.active_tracker()
    if tracker is not None:
        tracker.explicit_step()


@contextmanager
def iteration() -> Iterator[None]:
    """``with ddpdoctor.iteration(): ...`` marks one training iteration (it ends when the block ends)."""
    try:
        yield
    finally:
        step()

"""The watch options of every launching command (--hang-timeout, --startup-timeout, --on-hang) and the monitor they
make (launch/monitor.make_watcher)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ddpdoctor.launch.monitor import HangMonitor, make_watcher


# kwargs: click's parsed options of the command, as click hands them over (a boundary: the user's own flags)
def pop_watcher(kwargs: dict[str, Any]) -> HangMonitor:
    """The watcher of the --hang-timeout/--startup-timeout/--on-hang values `watch_options` added to ``kwargs``."""
    watcher = make_watcher(kwargs.pop("hang_timeout"), kwargs.pop("startup_timeout"), kwargs.pop("on_hang"))
    from ddpdoctor.job.divergence import DivergenceWatch

    # Every rank's per-step fingerprint compared job-wide (issue 38): first, so it judges before the live watch.
    watcher.plugins.insert(0, DivergenceWatch(kwargs.pop("on_divergence", None) or "warn"))
    return watcher


def watch_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--hang-timeout, --startup-timeout, --on-hang (pass them to make_watcher)."""
    fn = click.option("--on-divergence", type=click.Choice(["warn", "stop"]), default="warn", show_default=True,
                      help="When ranks' per-step fingerprints differ (a skipped step, a NaN on one rank, other "
                           "collectives): report it, or also stop the job at every rank's next optimizer step.")(fn)
    fn = click.option("--on-hang", type=click.Choice(["kill", "report"]), default="kill", show_default=True,
                      help="After a hang is reported: kill the job, or leave it running.")(fn)
    fn = click.option("--startup-timeout", type=float, default=600.0, show_default=True,
                      help="Seconds allowed for start-up and the first step before it counts as a hang.")(fn)
    fn = click.option("--hang-timeout", type=float, default=None,
                      help="Seconds without a step before a rank is hung [default: max(60, 10x slowest step); "
                           "a rank still busy (CPU, I/O) is then a long stall, not a hang].")(fn)
    return fn

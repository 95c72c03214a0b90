"""The signals that stop ddpdoctor (SIGINT, SIGTERM, SIGHUP, SIGQUIT) stop the job as torchrun would be stopped, then
SIGKILL what is left after a grace period or at a second signal."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ddpdoctor.launch.spec import RunningJob

STOP_GRACE_S = 10.0  # after the signal, the job's processes have this long to write what they recorded


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class Stopper:
    """ddpdoctor's handlers for the signals that stop it: record the first, stop the job as torchrun would be
    stopped, SIGKILL every process of the job that is left after STOP_GRACE_S or at a second signal."""

    def __init__(self, job: RunningJob) -> None:
        self.job = job
        self.signum: int | None = None
        self.kill_at: float | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for s in STOP_SIGNALS:
            self._old[s] = signal.signal(s, self._on_signal)

    def restore(self) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGHUP:
            _detach_from_terminal()
        if self.signum is not None:  # a second signal: the user insists
            self.job.kill(self.job.killed_by or f"signal {signal.Signals(signum).name}", signal.SIGKILL)
            return
        self.signum = signum
        # As torchrun itself would be stopped: it forwards the signal to every worker and waits for them. SIGHUP
        # and SIGQUIT become SIGTERM, so the ranks unwind and write what they recorded (probes/bootstrap.py).
        self.job.killed_by = self.job.killed_by or f"signal {signal.Signals(signum).name}"
        try:
            os.kill(self.job.proc.pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.kill_at = time.time() + STOP_GRACE_S

    def tick(self) -> None:
        if self.kill_at is not None and time.time() >= self.kill_at:
            self.kill_at = None
            self.job.kill(self.job.killed_by or "stopped", signal.SIGKILL)


def _detach_from_terminal() -> None:
    """After SIGHUP the terminal is gone: writes to it would fail (EIO), so the report goes to /dev/null instead of
    ending in a traceback. Output redirected to a file or a pipe is kept."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)

"""Starting a scenario's launchers (one per node) and collecting what they said: stdout, every stderr line with the
wall-clock time it arrived (the time a tool's verdict reached its user), exit codes. A launch that outlives its
timeout is stopped: its process group gets SIGTERM, then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class NodeRun:
    cmd: list[str]
    code: int | None = None
    stdout: str = ""
    stderr_lines: list[tuple[float, str]] = field(default_factory=list)
    ended_at: float = 0.0
    timed_out: bool = False

    @property
    def stderr(self) -> str:
        return "".join(line for _, line in self.stderr_lines)


def _read(stream, sink: list[tuple[float, str]] | list[str], timed: bool) -> None:
    for line in iter(stream.readline, ""):
        if timed:
            sink.append((time.time(), line))  # type: ignore[arg-type]
        else:
            sink.append(line)  # type: ignore[arg-type]
    stream.close()


def _stop(p: subprocess.Popen[str]) -> None:
    """As a scheduler's time limit would: SIGTERM to the launcher alone (a tool that reports on a stop gets to),
    then to the launch's whole process group, then SIGKILL."""
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
        return
    except subprocess.TimeoutExpired:
        pass
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)  # the group this launch started (start_new_session), nothing else
        except ProcessLookupError:
            return
        try:
            p.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(cmds: list[list[str]], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[list[NodeRun], float]:
    """Run every node's command at once; (their runs, when they were started)."""
    started = time.time()
    runs: list[NodeRun] = []
    procs: list[tuple[subprocess.Popen[str], NodeRun, list[threading.Thread], list[str]]] = []
    for cmd in cmds:
        run = NodeRun(cmd)
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        out: list[str] = []
        threads = [threading.Thread(target=_read, args=(p.stdout, out, False), daemon=True),
                   threading.Thread(target=_read, args=(p.stderr, run.stderr_lines, True), daemon=True)]
        for t in threads:
            t.start()
        procs.append((p, run, threads, out))
        runs.append(run)
    deadline = started + timeout_s
    for p, run, threads, out in procs:
        try:
            p.wait(max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            run.timed_out = True
            _stop(p)
        run.ended_at = time.time()
        for t in threads:
            t.join(5)
        run.code = p.returncode
        run.stdout = "".join(out)
    return runs, started

"""The ranks' output: torchrun's per-rank lines copied to the run directory and the console as they come (tee),
its logs gathered into RUN/ranks/rankR/ once the job ended, and its own words when no rank started."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.job.role import job_role
from ddpdoctor.launch.spec import LaunchSpec
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.private import open_private, private_dir


def node_logs(spec: LaunchSpec) -> Path:
    """Where this launcher's torchrun logs go: RUN/torchrun, or RUN/torchrun/nodeN for a node of a multi-node job
    (the nodes share the run directory; each copies its own ranks' logs)."""
    role = job_role(spec.torchrun, spec.launcher)
    return spec.run_dir.torchrun_logs / f"node{role.node_rank}" if role else spec.run_dir.torchrun_logs


def tee(stream: Any, path: Path, echo: Any, keep: Callable[[bytes], bool] | None = None,
         on_error: Callable[[Path, BaseException], None] | None = None) -> threading.Thread:
    """Copy ``stream`` into ``path`` (owner-only) and, for the lines ``keep`` accepts (all by default), to ``echo``.
    A write that fails (a full disk) stops the copy into the file, says so through ``on_error``, and the stream is
    still drained and echoed: the job must never block on a pipe nobody reads."""

    def pump(echo: Any = echo) -> None:
        f: Any = None
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            f = os.fdopen(open_private(path), "wb")  # never through a link planted in its place (docs/trust.md)
        except (OSError, BadInput) as exc:
            if on_error is not None:
                on_error(path, exc)
        try:
            for line in iter(stream.readline, b""):
                if f is not None:
                    try:
                        f.write(line)
                        f.flush()
                    except OSError as exc:
                        if on_error is not None:
                            on_error(path, exc)
                        _close_quietly(f)
                        f = None
                if echo is not None and (keep is None or keep(line)):
                    try:
                        echo.write(line)
                        echo.flush()
                    except (OSError, ValueError):
                        echo = None  # the terminal went away (SIGHUP): keep logging
        finally:
            _close_quietly(f)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def _close_quietly(f: Any) -> None:
    try:
        if f is not None:
            f.close()
    except OSError:  # its last buffered bytes did not fit either
        pass


# torchrun's --tee prefixes each rank's line with "[<role><local rank>]:"; everything else on its stderr is its
# own (agent logs, SignalException tracebacks when it is stopped): that goes to RUN/torchrun/torchrun.log only.
RANK_LINE = re.compile(rb"^\[[A-Za-z_]*\d+\]:")


# Kineto's own trace of when the profiler starts and stops ("USDT:2026-11-25 13:20:53 6118:6118
# SyncActivityProfilerHandler.cpp:52] profiler_start"): kept in the rank logs, not shown on the user's console.
_KINETO_USDT = re.compile(rb"^\[[A-Za-z_]*\d+\]:\s*USDT:[^\n]*\] profiler_(?:start|stop)\s*$")


def is_rank_line(line: bytes) -> bool:
    """A rank's line as torchrun tees it ("[default0]:..."), to echo on the console (Kineto's USDT lines aside)."""
    return bool(RANK_LINE.match(line)) and not _KINETO_USDT.match(line)


def echo_torchrun_failure(run: RunDir, logs: Path) -> None:
    """torchrun failed before any rank started (bad flags, rendezvous): its own words are the only explanation."""
    from ddpdoctor.safe_io import clean_text

    try:
        text = (logs / "torchrun.log").read_text(errors="replace")
    except OSError:
        return
    tail = "\n".join(text.strip().splitlines()[-25:])
    if tail:
        sys.stderr.write(clean_text(tail) + "\n")


def wait_for_ranks(run: RunDir, world_size: int, timeout_s: float = 60.0) -> None:
    """Under --launcher none rank 0 reports for the job: give the other ranks' probes time to write their files."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if all(run.rank_file(r, "status.json").exists() for r in range(world_size)):
            time.sleep(0.5)  # the summary is written right after the status
            return
        time.sleep(0.2)


def collect_torchrun_logs(run: RunDir, logs: Path | None = None, ranks: set[int] | None = None,
                          on_error: Callable[[Path, BaseException], None] | None = None) -> None:
    """Copy torchrun's per-local-rank logs (under ``logs``) to RUN/ranks/rankR/{stdout,stderr}.log (the latest
    attempt); ``ranks``: this node's ranks, when other nodes' ranks share the run directory. A copy that does not
    fit (a full disk) goes to ``on_error`` (the logs stay under torchrun/), or raises one line without it."""
    local_to_rank: dict[int, int] = {}
    for rank in run.ranks_present():
        if ranks is not None and rank not in ranks:
            continue
        info = run.rank_file(rank, "info.json")
        try:
            import json

            local_to_rank[int(json.loads(info.read_text())["local_rank"])] = rank
        except (OSError, ValueError, KeyError, TypeError):
            continue
    attempts = sorted((logs or run.torchrun_logs).glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    if not attempts:
        return
    latest = attempts[-1]
    for local_dir in latest.iterdir():
        if not local_dir.name.isdigit():
            continue
        rank = local_to_rank.get(int(local_dir.name), int(local_dir.name))
        for stream in ("stdout", "stderr"):
            src = local_dir / f"{stream}.log"
            if src.exists():
                dst = run.rank_file(rank, f"{stream}.log")
                try:
                    private_dir(dst.parent)
                    with open(src, "rb") as fsrc, os.fdopen(open_private(dst), "wb") as fdst:
                        shutil.copyfileobj(fsrc, fdst)
                except OSError as exc:  # a full disk: one line naming the file (the logs stay under torchrun/)
                    from ddpdoctor.rundir.artefacts import write_error

                    dst.unlink(missing_ok=True)
                    if on_error is None:
                        raise write_error(exc, dst) from exc
                    on_error(dst, exc)

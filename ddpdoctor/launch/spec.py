"""The launch as data: what to start (LaunchSpec) and its checks, the running job (its process tree, which it
signals), and what came of it (LaunchResult); the watcher's interface (JobWatcher). launch/launcher.py runs it."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ddpdoctor.errors import BadInput
from ddpdoctor.launch.flags import FlagValue
from ddpdoctor.launch.proctree import descendants, kill_group
from ddpdoctor.probes.config import ProbeOptions, Schedule
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.reserve import SpaceReserve


class JobWatcher(Protocol):
    """Something that watches a running job (the heartbeat monitor). ``address`` goes to the ranks."""

    def start(self, spec: LaunchSpec) -> str | None: ...

    def check(self, job: RunningJob) -> None: ...

    def stop(self, job: RunningJob) -> None: ...


@dataclass
class LaunchSpec:
    mode: str  # "profile", "run", "check-sync"
    script: str
    script_args: list[str]
    run_dir: RunDir
    torchrun: dict[str, FlagValue] = field(default_factory=dict)  # torchrun flags as given
    launcher: str = "torchrun"  # or "none": the scheduler started one process per rank
    schedule: Schedule = field(default_factory=Schedule)
    options: ProbeOptions = field(default_factory=lambda: ProbeOptions())  # the mode's options for the probes
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the ranks
    quiet: bool = False  # don't echo rank output to the console
    output_to_stderr: bool = False  # keep stdout clean for --json
    overwrite: bool = False  # replace an earlier run in the same run directory
    program: Path | None = None  # a Python file every rank runs instead of the bootstrap (preflight's worker)
    job_id: str | None = None  # launchers of one job (its nodes) share --out: launch/runlock.py

    @property
    def as_module(self) -> bool:
        return bool(self.torchrun.get("--module"))


@dataclass
class RunningJob:
    spec: LaunchSpec
    proc: subprocess.Popen[bytes]
    started: float
    killed_by: str | None = None
    reserve: SpaceReserve | None = None  # room for the last writes on a disk that fills (rundir/reserve.py)

    def kill(self, reason: str, sig: int = signal.SIGTERM) -> None:
        """Signal every process of the job: torchrun's process group and each process below it (torchrun starts
        every worker in a session of its own, so the group alone misses the ranks). PIDs come from /proc, from
        the tree ddpdoctor started, never from a message."""
        self.killed_by = self.killed_by or reason
        for pid in sorted(descendants(self.proc.pid)):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        kill_group(self.proc.pid, sig)


@dataclass
class LaunchResult:
    exit_code: int
    run_dir: RunDir
    duration_s: float
    killed_by: str | None = None
    reports: bool = True  # False for ranks other than 0 under --launcher none: rank 0 reports for the job
    signum: int | None = None  # the signal that stopped ddpdoctor (and so the job); the command exits 128+signum
    note: str | None = None  # a node that does not report: the head's verdict, printed instead of a report
    job: Any = None  # a job of several nodes: its agent (job/agent.JobAgent: node_info, publish_report, job_report)


def validate(spec: LaunchSpec) -> None:
    if spec.torchrun.get("--no-python"):
        raise BadInput("--no-python is not supported: ddpdoctor attaches its probes to a Python script")
    if not spec.as_module:
        path = Path(spec.script)
        if not path.exists():
            raise BadInput("script not found", spec.script)
        if not path.is_file():
            raise BadInput("not a file", spec.script)
        if not os.access(path, os.R_OK):
            raise BadInput("script is not readable", spec.script)
        from ddpdoctor.launch.spawn_check import spawn_problem

        problem = spawn_problem(path)  # mp.spawn: found now, not after the 600 s start-up timeout
        if problem:
            raise BadInput(problem, spec.script)
    if spec.launcher not in ("torchrun", "none"):
        raise BadInput(f"--launcher must be torchrun or none, not {spec.launcher!r}")
    s = spec.schedule
    if min(s.wait, s.warmup) < 0 or s.active < 1 or s.repeat < 1:
        raise BadInput("--wait and --warmup must be >= 0, --active and --repeat >= 1")
    nproc = spec.torchrun.get("--nproc-per-node")
    if nproc is not None and not (str(nproc).isdigit() and int(nproc) > 0) and nproc not in ("gpu", "cpu", "auto"):
        raise BadInput(f"--nproc-per-node must be a positive integer, gpu, cpu or auto, not {nproc!r}")


def single_node(torchrun: dict[str, FlagValue]) -> bool:
    nnodes = str(torchrun.get("--nnodes") or "1")
    return nnodes in ("1", "1:1")


def store_bind_address(torchrun: dict[str, FlagValue]) -> str | None:
    """Where torchrun's TCP stores listen: loopback for a single-node job; for a multi-node job the endpoint's
    address when it is a literal IP address, else None (torchrun's own choice: every interface)."""
    if single_node(torchrun):
        return "127.0.0.1"
    endpoint = str(torchrun.get("--rdzv-endpoint") or torchrun.get("--master-addr") or "")
    host = endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 else endpoint.strip("[]").rsplit("]:", 1)[0]
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return host

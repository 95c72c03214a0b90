"""Starts the user's script on every rank with ddpdoctor's bootstrap: through torchrun, or in place under SLURM/MPI.

The launcher owns the job's process tree: it writes the manifest, starts the ranks, lets a watcher
(heartbeat monitor) look at them while they run, and collects each rank's output and exit status."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ddpdoctor.errors import BadInput
from ddpdoctor.launch.flags import torchrun_argv
from ddpdoctor.probes.config import ENV_VAR, ProbeConfig, Schedule, rank_from_env
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir

BOOTSTRAP = Path(__file__).resolve().parents[1] / "probes" / "bootstrap.py"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


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
    torchrun: dict[str, Any] = field(default_factory=dict)  # torchrun flags as given
    launcher: str = "torchrun"  # or "none": the scheduler started one process per rank
    schedule: Schedule = field(default_factory=Schedule)
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the ranks
    quiet: bool = False  # don't echo rank output to the console
    output_to_stderr: bool = False  # keep stdout clean for --json
    overwrite: bool = False  # replace an earlier run in the same run directory
    program: Path | None = None  # a Python file every rank runs instead of the bootstrap (preflight's worker)

    @property
    def as_module(self) -> bool:
        return bool(self.torchrun.get("--module"))


@dataclass
class RunningJob:
    spec: LaunchSpec
    proc: subprocess.Popen[bytes]
    started: float
    killed_by: str | None = None

    def kill(self, reason: str, sig: int = signal.SIGTERM) -> None:
        """End every process of the job (the launcher runs it in its own process group)."""
        self.killed_by = self.killed_by or reason
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass


@dataclass
class LaunchResult:
    exit_code: int
    run_dir: RunDir
    duration_s: float
    killed_by: str | None = None
    reports: bool = True  # False for ranks other than 0 under --launcher none: rank 0 reports for the job


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
    if spec.launcher not in ("torchrun", "none"):
        raise BadInput(f"--launcher must be torchrun or none, not {spec.launcher!r}")
    s = spec.schedule
    if min(s.wait, s.warmup) < 0 or s.active < 1 or s.repeat < 1:
        raise BadInput("--wait and --warmup must be >= 0, --active and --repeat >= 1")
    nproc = spec.torchrun.get("--nproc-per-node")
    if nproc is not None and not (str(nproc).isdigit() and int(nproc) > 0) and nproc not in ("gpu", "cpu", "auto"):
        raise BadInput(f"--nproc-per-node must be a positive integer, gpu, cpu or auto, not {nproc!r}")


def _rank_env(spec: LaunchSpec, monitor: str | None) -> dict[str, str]:
    config = ProbeConfig(
        mode=spec.mode,
        run_dir=str(spec.run_dir.root.resolve()),
        script=spec.script,
        script_args=list(spec.script_args),
        as_module=spec.as_module,
        schedule=spec.schedule,
        monitor=monitor,
        options=spec.options,
    )
    env = dict(os.environ)
    env.update(spec.env)
    env[ENV_VAR] = config.to_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _torchrun_command(spec: LaunchSpec) -> list[str]:
    flags = dict(spec.torchrun)
    flags.setdefault("--log-dir", str(spec.run_dir.torchrun_logs))
    if spec.quiet:
        flags.pop("--tee", None)
        flags["--redirects"] = "3"  # to the log files only
    elif "--redirects" not in flags:
        flags.setdefault("--tee", "3")
    if not any(k in flags for k in ("--standalone", "--rdzv-endpoint", "--master-port", "--rdzv-backend")):
        flags["--standalone"] = True  # torchrun's own default port would clash between jobs on one host
    return [sys.executable, "-m", "torch.distributed.run", *torchrun_argv(flags), str(spec.program or BOOTSTRAP)]


def _slurm_env() -> dict[str, str]:
    """Under srun/mpirun with --launcher none: torchrun-style variables from the scheduler's."""
    env = os.environ
    rank, world, local = rank_from_env()
    out = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local)}
    if "MASTER_ADDR" not in env:
        out["MASTER_ADDR"] = env.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    if "MASTER_PORT" not in env:
        job = env.get("SLURM_JOB_ID", "0")
        out["MASTER_PORT"] = str(20000 + int(job) % 20000) if job.isdigit() else "29500"
    return out


def _tee(stream: Any, path: Path, echo: Any) -> threading.Thread:
    def pump() -> None:
        with path.open("wb") as f:
            for line in iter(stream.readline, b""):
                f.write(line)
                f.flush()
                if echo is not None:
                    echo.write(line)
                    echo.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    return t


def launch(spec: LaunchSpec, watcher: JobWatcher | None = None) -> LaunchResult:
    """Run the job to the end and return its exit code (the job's, as torchrun reports it)."""
    validate(spec)
    in_place_rank: int | None = None  # this process's rank under --launcher none
    if spec.launcher == "none":
        scheduler_env = _slurm_env()
        in_place_rank = int(scheduler_env["RANK"])
        # Every rank runs this at once: none can tell an old run from its peers', so each clears only its own files.
        spec.run_dir.ensure_writable(overwrite=True, keep_existing=True)
        spec.run_dir.clear_rank(in_place_rank)
    else:
        spec.run_dir.ensure_writable(spec.overwrite)
    if in_place_rank in (None, 0) or spec.program is not None:
        manifest_mod.write_initial(spec)
    monitor = watcher.start(spec) if watcher is not None else None
    env = _rank_env(spec, monitor)
    # The monitor's token reaches the ranks through their environment only (docs/trust.md).
    env.update(getattr(watcher, "rank_env", dict)())
    started = time.time()
    tees: list[threading.Thread] = []
    if spec.launcher == "torchrun":
        cmd = _torchrun_command(spec)
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=sys.stderr if spec.output_to_stderr else None
        )
    else:
        env.update(scheduler_env)
        rank = int(env["RANK"])
        rdir = spec.run_dir.rank_dir(rank)
        rdir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, str(spec.program or BOOTSTRAP)], env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        out = None if spec.quiet else (sys.stderr.buffer if spec.output_to_stderr else sys.stdout.buffer)
        err = None if spec.quiet else sys.stderr.buffer
        tees = [_tee(proc.stdout, rdir / "stdout.log", out), _tee(proc.stderr, rdir / "stderr.log", err)]
    job = RunningJob(spec=spec, proc=proc, started=started)

    def forward(signum: int, frame: Any) -> None:
        job.kill(f"signal {signal.Signals(signum).name}", signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while proc.poll() is None:
            if watcher is not None:
                watcher.check(job)
            time.sleep(0.1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if watcher is not None:
            watcher.stop(job)
    for t in tees:
        t.join(timeout=5)
    code = proc.returncode
    if code is not None and code < 0:
        code = 128 - code
    if spec.launcher == "torchrun":
        collect_torchrun_logs(spec.run_dir)
    elif spec.program is not None:
        pass  # a program of ddpdoctor's own (preflight) merges its ranks' records itself
    elif in_place_rank == 0:
        wait_for_ranks(spec.run_dir, int(scheduler_env["WORLD_SIZE"]))
    else:
        return LaunchResult(exit_code=code, run_dir=spec.run_dir, duration_s=time.time() - started,
                            killed_by=job.killed_by, reports=False)
    manifest_mod.finalize(spec.run_dir, exit_code=code, duration_s=time.time() - started, killed_by=job.killed_by)
    return LaunchResult(exit_code=code, run_dir=spec.run_dir, duration_s=time.time() - started, killed_by=job.killed_by)


def wait_for_ranks(run: RunDir, world_size: int, timeout_s: float = 60.0) -> None:
    """Under --launcher none rank 0 reports for the job: give the other ranks' probes time to write their files."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if all(run.rank_file(r, "status.json").exists() for r in range(world_size)):
            time.sleep(0.5)  # the summary is written right after the status
            return
        time.sleep(0.2)


def collect_torchrun_logs(run: RunDir) -> None:
    """Copy torchrun's per-local-rank logs to RUN/ranks/rankR/{stdout,stderr}.log (the latest attempt)."""
    local_to_rank: dict[int, int] = {}
    for rank in run.ranks_present():
        info = run.rank_file(rank, "info.json")
        try:
            import json

            local_to_rank[int(json.loads(info.read_text())["local_rank"])] = rank
        except (OSError, ValueError, KeyError):
            continue
    attempts = sorted(run.torchrun_logs.glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
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
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)

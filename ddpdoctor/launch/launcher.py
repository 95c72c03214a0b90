"""Starts the user's script on every rank with ddpdoctor's bootstrap: through torchrun, or in place under SLURM/MPI.

The launcher owns the job's process tree: it writes the manifest, starts the ranks, lets a watcher
(heartbeat monitor) look at them while they run, and collects each rank's output and exit status."""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from ddpdoctor.errors import BadInput
from ddpdoctor.job.agent import attach_agent
from ddpdoctor.job.role import JobRole, job_role
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.launch import runlock
from ddpdoctor.launch.flags import FlagValue, torchrun_argv
from ddpdoctor.launch.proctree import descendants, kill_group
from ddpdoctor.launch.torchrun_shim import BIND_ENV as STORE_BIND_ENV
from ddpdoctor.probes.config import ENV_VAR, ProbeConfig, ProbeOptions, Schedule, rank_from_env
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.private import claim_run_root, open_private, private_dir
from ddpdoctor.rundir.records import RunEndedDoc
from ddpdoctor.rundir.reserve import SpaceReserve

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


def _rank_env(spec: LaunchSpec, monitor: str | None) -> dict[str, str]:
    config = ProbeConfig(
        mode=spec.mode,
        run_dir=str(spec.run_dir.root.resolve()),
        script=spec.script,
        script_args=list(spec.script_args),
        as_module=spec.as_module,
        schedule=spec.schedule,
        monitor=monitor,
        options=dict(spec.options),
    )
    env = dict(os.environ)
    env.update(spec.env)
    env[ENV_VAR] = config.to_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_PARENT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def node_logs(spec: LaunchSpec) -> Path:
    """Where this launcher's torchrun logs go: RUN/torchrun, or RUN/torchrun/nodeN for a node of a multi-node job
    (the nodes share the run directory; each copies its own ranks' logs)."""
    role = job_role(spec.torchrun, spec.launcher)
    return spec.run_dir.torchrun_logs / f"node{role.node_rank}" if role else spec.run_dir.torchrun_logs


def _torchrun_command(spec: LaunchSpec) -> list[str]:
    flags = dict(spec.torchrun)
    flags.setdefault("--log-dir", str(node_logs(spec)))
    if spec.quiet:
        flags.pop("--tee", None)
        flags["--redirects"] = "3"  # to the log files only
    elif "--redirects" not in flags:
        flags.setdefault("--tee", "3")
    if not any(k in flags for k in ("--standalone", "--rdzv-endpoint", "--master-port", "--rdzv-backend")):
        # What --standalone does (a c10d store on a free port: torchrun's default port would clash between jobs
        # on one host), at 127.0.0.1 rather than "localhost" (which may resolve to ::1 first).
        flags.update({"--rdzv-backend": "c10d", "--rdzv-endpoint": "127.0.0.1:0", "--rdzv-id": uuid.uuid4().hex})
    # The shim is torchrun with its stores bound where store_bind_address() says (launch/torchrun_shim.py).
    return [sys.executable, "-m", "ddpdoctor.launch.torchrun_shim", *torchrun_argv(flags),
            str(spec.program or BOOTSTRAP)]


def _as_json(options: ProbeOptions) -> JsonObject:
    """The probe options as the manifest's plain JSON (they are JSON values already: no copy is kept)."""
    out: JsonObject = msgspec.to_builtins(options)
    return out


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


def _tee(stream: Any, path: Path, echo: Any, keep: Callable[[bytes], bool] | None = None,
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
_RANK_LINE = re.compile(rb"^\[[A-Za-z_]*\d+\]:")


def _is_rank_line(line: bytes) -> bool:
    return bool(_RANK_LINE.match(line))


def _parent_death_preexec() -> Callable[[], None]:
    """preexec_fn for torchrun: SIGKILL when ddpdoctor dies (PR_SET_PDEATHSIG); its workers set the same on
    torchrun (probes/bootstrap.py), so no rank outlives its watcher. Resolved before fork: the child only calls."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # ddpdoctor died before the line above took effect
            os._exit(1)

    return preexec


def _job_id(spec: LaunchSpec, scheduler_env: dict[str, str] | None) -> str | None:
    """What launchers of one job share (they may share its run directory); None: a single-launcher job."""
    if scheduler_env is not None:
        env = os.environ
        return f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', '')}@{scheduler_env.get('MASTER_ADDR', env.get('MASTER_ADDR'))}:" \
               f"{scheduler_env.get('MASTER_PORT', env.get('MASTER_PORT'))}"
    return spec.job_id


def launch(spec: LaunchSpec, watcher: JobWatcher | None = None) -> LaunchResult:
    """Run the job to the end and return its exit code (the job's, as torchrun reports it).

    SIGINT, SIGTERM, SIGHUP and SIGQUIT to ddpdoctor stop the job (the signal to every process of the job, then
    SIGKILL after STOP_GRACE_S) and are recorded in the manifest's ``ended``; the caller reports and exits 128+signal."""
    validate(spec)
    in_place_rank: int | None = None  # this process's rank under --launcher none
    scheduler_env = _slurm_env() if spec.launcher == "none" else None
    role = job_role(spec.torchrun, spec.launcher, scheduler_env)  # multi-node: this node's part (ddpdoctor/job)
    if role is not None and spec.program is not None:
        role = None  # ddpdoctor's own programs (preflight) merge their ranks' records themselves
    if role is not None:
        spec.job_id = spec.job_id or role.key
    ours = not spec.run_dir.root.exists() or spec.run_dir.is_run_dir()
    # Before anything is written there: a folder another user made or may write could hold planted links.
    claim_run_root(spec.run_dir.root)
    lock = runlock.acquire(spec.run_dir.root, _job_id(spec, scheduler_env))
    # What ddpdoctor itself writes is owner-only (TensorBoard's event files, folders made by libraries); the job
    # keeps the user's umask (Popen(umask=...)).
    user_umask = os.umask(0o077)
    try:
        if scheduler_env is not None:
            in_place_rank = int(scheduler_env["RANK"])
            # Every rank runs this at once: none can tell an old run from its peers', so each clears only its own files.
            spec.run_dir.ensure_writable(overwrite=True, keep_existing=True)
            spec.run_dir.clear_rank(in_place_rank)
        elif role is not None and not role.is_head:
            # Another node of the job writes here too: keep its files; the head writes the manifest.
            spec.run_dir.ensure_writable(overwrite=True, keep_existing=True)
        else:
            spec.run_dir.ensure_writable(spec.overwrite)
        _make_private(spec.run_dir, root_too=ours)
        if (in_place_rank in (None, 0) and (role is None or role.is_head)) or spec.program is not None:
            manifest_mod.write_initial(spec.run_dir, spec.mode, spec.script, list(spec.script_args), spec.launcher,
                                       spec.torchrun, asdict(spec.schedule), _as_json(spec.options))
        return _launch_locked(spec, watcher, in_place_rank, scheduler_env, role, user_umask)
    finally:
        os.umask(user_umask)
        lock.release()


def _launch_locked(spec: LaunchSpec, watcher: JobWatcher | None, in_place_rank: int | None,
                   scheduler_env: dict[str, str] | None, role: JobRole | None = None,
                   user_umask: int = -1) -> LaunchResult:
    agent = attach_agent(role, watcher, spec.run_dir.root) if role is not None else None
    monitor = watcher.start(spec) if watcher is not None else None
    env = _rank_env(spec, monitor)
    # The monitor's token reaches the ranks through their environment only (docs/trust.md).
    env.update(getattr(watcher, "rank_env", dict)())
    started = time.time()
    # Under --launcher none every rank is a launcher: only rank 0 (which reports) holds the full reserve, so that
    # 1,024 ranks hold 256 KiB + 1,023 x 16 KiB on the shared disk, not 256 MiB.
    reserve = SpaceReserve(spec.run_dir.root, total=None if in_place_rank in (None, 0) else 16 << 10)
    reserve.hold()
    tees: list[threading.Thread] = []
    console_err = None if spec.quiet else sys.stderr.buffer
    if spec.launcher == "torchrun":
        cmd = _torchrun_command(spec)
        bind = store_bind_address(spec.torchrun)
        if bind:
            env[STORE_BIND_ENV] = bind
        proc = subprocess.Popen(
            cmd, env=env, start_new_session=True, stdout=sys.stderr if spec.output_to_stderr else None,
            stderr=subprocess.PIPE, preexec_fn=_parent_death_preexec(), umask=user_umask,
        )
        node_logs(spec).mkdir(mode=0o700, parents=True, exist_ok=True)
        tees = [_tee(proc.stderr, node_logs(spec) / "torchrun.log", sys.stderr.buffer, _is_rank_line, reserve.note)]
    else:
        assert scheduler_env is not None
        env.update(scheduler_env)
        rank = int(env["RANK"])
        rdir = spec.run_dir.rank_dir(rank)
        rdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, str(spec.program or BOOTSTRAP)], env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_parent_death_preexec(), umask=user_umask,
        )
        out = None if spec.quiet else (sys.stderr.buffer if spec.output_to_stderr else sys.stdout.buffer)
        tees = [_tee(proc.stdout, rdir / "stdout.log", out, on_error=reserve.note),
                _tee(proc.stderr, rdir / "stderr.log", console_err, on_error=reserve.note)]
    job = RunningJob(spec=spec, proc=proc, started=started, reserve=reserve)
    stopper = Stopper(job)
    ended: RunEndedDoc | None = None
    try:
        stopper.install()
        while proc.poll() is None:
            if watcher is not None and stopper.signum is None:
                watcher.check(job)
            stopper.tick()
            reserve.tick()
            time.sleep(0.1)
    except BaseException as exc:
        # ddpdoctor itself failed (a bug, or an exception out of a watcher): the job must not run on unwatched.
        job.kill(f"ddpdoctor error: {type(exc).__name__}", signal.SIGKILL)
        proc.wait()
        ended = {"how": "ddpdoctor-error", "error": f"{type(exc).__name__}: {exc}"[:2000]}
        raise
    finally:
        stopper.restore()
        if watcher is not None:
            try:
                watcher.stop(job)
            except OSError as exc:  # a full disk (DiskFull): the monitor's files are noted as missing
                reserve.note(getattr(exc, "path", None) or "heartbeats.json", exc)
        if ended is not None:
            _finalize(spec, proc.returncode, started, job, ended)
    for t in tees:
        t.join(timeout=5)
    code = proc.returncode
    if code is not None and code < 0:
        code = 128 - code
    if stopper.signum is not None:
        ended = {"how": "signal", "signal": signal.Signals(stopper.signum).name, "signum": stopper.signum,
                 "exit_code": 128 + stopper.signum}
    elif job.killed_by == "hang":
        ended = {"how": "hang", "exit_code": 1}
    else:
        ended = {"how": "exited", "exit_code": code}
    if spec.launcher == "torchrun":
        collect_torchrun_logs(spec.run_dir, node_logs(spec), set(agent.monitor.rank_ids()) if agent is not None else None,
                              on_error=reserve.note)
        if code and not spec.run_dir.ranks_present():
            _echo_torchrun_failure(spec.run_dir, node_logs(spec))
    if agent is not None:
        # Multi-node: the head waits for every node and reports for the job; the others print its verdict.
        outcome = agent.finish(spec.run_dir.root, code or 0)
        if not outcome.reports:
            return LaunchResult(exit_code=outcome.code, run_dir=spec.run_dir, duration_s=time.time() - started,
                                killed_by=job.killed_by, reports=False, signum=stopper.signum, note=outcome.line,
                                job=agent)
        code = outcome.code
        if ended.get("how") == "exited":
            ended["exit_code"] = code
    elif spec.launcher == "torchrun" or spec.program is not None:
        pass  # a program of ddpdoctor's own (preflight) merges its ranks' records itself
    elif in_place_rank == 0:
        assert scheduler_env is not None
        wait_for_ranks(spec.run_dir, int(scheduler_env["WORLD_SIZE"]))
    else:
        return LaunchResult(exit_code=code, run_dir=spec.run_dir, duration_s=time.time() - started,
                            killed_by=job.killed_by, reports=False, signum=stopper.signum)
    _finalize(spec, code, started, job, ended)
    return LaunchResult(exit_code=code, run_dir=spec.run_dir, duration_s=time.time() - started,
                        killed_by=job.killed_by, signum=stopper.signum, job=agent)


def _finalize(spec: LaunchSpec, code: int | None, started: float, job: RunningJob, ended: RunEndedDoc) -> None:
    """The manifest's end, written into the space held back for it (rundir/reserve.py). When even that does not
    fit: one line, and the run reads as unfinished (`status`, `analyze`)."""
    reserve = job.reserve
    if reserve is not None:
        reserve.release()
    try:
        manifest_mod.finalize(spec.run_dir, exit_code=code, duration_s=time.time() - started, killed_by=job.killed_by,
                              ended=ended, disk_full=reserve.facts() if reserve is not None else None)
    except OSError as exc:  # DiskFull: a BadInput and an OSError
        from ddpdoctor.terminal_text import one_line

        sys.stderr.write(f"ddpdoctor: error: {one_line(str(exc))}; the run directory reads as unfinished\n")


def _make_private(run: RunDir, root_too: bool) -> None:
    """The run directory's own folders are owner-only (0700): they hold stacks, environments and logs. The root
    too when ddpdoctor made it (a folder the user pointed --out at keeps its mode; its ddpdoctor parts do not)."""
    for d in (run.traces, run.root / "ranks", run.scalars, run.torchrun_logs, *((run.root,) if root_too else ())):
        try:
            private_dir(d)
        except (OSError, BadInput):
            pass


def _echo_torchrun_failure(run: RunDir, logs: Path) -> None:
    """torchrun failed before any rank started (bad flags, rendezvous): its own words are the only explanation."""
    from ddpdoctor.safe_io import clean_text

    try:
        text = (logs / "torchrun.log").read_text(errors="replace")
    except OSError:
        return
    tail = "\n".join(text.strip().splitlines()[-25:])
    if tail:
        sys.stderr.write(clean_text(tail) + "\n")


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

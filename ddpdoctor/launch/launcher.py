"""Starts the user's script on every rank with ddpdoctor's bootstrap: through torchrun, or in place under SLURM/MPI.

The launcher owns the job's process tree: it writes the manifest, starts the ranks, lets a watcher
(heartbeat monitor) look at them while they run, and collects each rank's output and exit status. The launch as
data is launch/spec.py (LaunchSpec, RunningJob, LaunchResult: imported from here too), the ranks' output
launch/rank_io.py, the signals that stop it launch/stopper.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import msgspec

from ddpdoctor.errors import BadInput
from ddpdoctor.job.agent import attach_agent
from ddpdoctor.job.role import JobRole, job_role
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.launch import runlock
from ddpdoctor.launch.flags import torchrun_argv
from ddpdoctor.launch.rank_io import (
    collect_torchrun_logs,
    echo_torchrun_failure,
    is_rank_line,
    node_logs,
    tee,
    wait_for_ranks,
)
from ddpdoctor.launch.spec import (
    JobWatcher,
    LaunchResult,
    LaunchSpec,
    RunningJob,
    store_bind_address,
    validate,
)
from ddpdoctor.launch.stopper import Stopper
from ddpdoctor.launch.torchrun_shim import BIND_ENV as STORE_BIND_ENV
from ddpdoctor.probes.config import ENV_VAR, ProbeConfig, ProbeOptions, rank_from_env
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.private import claim_run_root, make_private_tree, private_dir
from ddpdoctor.rundir.records import RunEndedDoc
from ddpdoctor.rundir.reserve import SpaceReserve

BOOTSTRAP = Path(__file__).resolve().parents[1] / "probes" / "bootstrap.py"
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


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
        tees = [tee(proc.stderr, node_logs(spec) / "torchrun.log", sys.stderr.buffer, is_rank_line, reserve.note)]
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
        tees = [tee(proc.stdout, rdir / "stdout.log", out, on_error=reserve.note),
                tee(proc.stderr, rdir / "stderr.log", console_err, on_error=reserve.note)]
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
            echo_torchrun_failure(spec.run_dir, node_logs(spec))
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
    make_private_tree(spec.run_dir.traces)  # the profiler writes them inside the ranks, with the user's umask
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

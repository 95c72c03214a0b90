"""Signals to ddpdoctor are facts (issues 12.3, 13.3): the job is stopped, what was recorded is kept, the report
says "stopped"/"interrupted" (never "ok", never a rank crash), the exit code is 128+signal, no process of the job
is left (checked with `ps`), and torchrun's own tracebacks stay out of the console."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.launch.proctree import descendants
from tests.conftest import REPO, SCENARIOS, run_cli

pytestmark = pytest.mark.slow


def start(tmp_path: Path, command: str, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path, Path]:
    out, mark = tmp_path / "run", tmp_path / "under-way"
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", STEPS="100000", STEP_SLEEP="0.05", MARK_FILE=str(mark),
                    CKPT_DIR=str(tmp_path), **(env or {}))
    json_flag = [] if "--no-json" in extra else ["--json"]
    extra = tuple(e for e in extra if e != "--no-json")
    args = [sys.executable, "-m", "ddpdoctor", command, "--nproc-per-node", "2", *json_flag, "--out", str(out),
            *extra, str(SCENARIOS / "pause.py")]
    # Its own session, as a terminal gives a job: a signal goes to ddpdoctor only, the way `kill PID` sends it.
    proc = subprocess.Popen(args, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, out, mark


def wait_under_way(proc: subprocess.Popen[str], mark: Path, timeout: float = 90) -> set[int]:
    """Wait until rank 0 passed step 3; the job's PIDs (torchrun, ranks) at that moment."""
    deadline = time.time() + timeout
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the job never got under way"
        time.sleep(0.1)
    time.sleep(0.5)
    return descendants(proc.pid)


def listening(pids: set[int]) -> list[str]:
    """The local addresses these processes listen on (TCP), from `ss`."""
    if not shutil.which("ss"):
        pytest.skip("ss is not installed")
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [line.split()[3] for line in out.splitlines() if any(f"pid={p}," in line for p in pids)]


def left_alive(pids: set[int]) -> list[str]:
    """`ps` lines of the PIDs still alive (zombies awaiting their reaper count as gone)."""
    if not pids:
        return []
    ps = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-p", ",".join(map(str, sorted(pids)))],
                        capture_output=True, text=True)
    return [line for line in ps.stdout.splitlines() if line.split()[1][0] != "Z"]


def gone_within(pids: set[int], seconds: float) -> list[str]:
    deadline = time.time() + seconds
    while (alive := left_alive(pids)) and time.time() < deadline:
        time.sleep(0.2)
    return alive


def stop_with(tmp_path: Path, command: str, sig: int, *extra: str) -> tuple[int, dict[str, Any], str, Path, set[int]]:
    proc, out, mark = start(tmp_path, command, *extra)
    pids = wait_under_way(proc, mark)
    if command == "run":
        # A single-node job listens on loopback only: ddpdoctor's monitor, torchrun's stores, gloo (13.7).
        assert listening(pids | {proc.pid}) and all(a.startswith("127.0.0.1:") for a in listening(pids | {proc.pid}))
    if command == "run":  # the live run's directory is locked: a second launch into it is refused (13.8)
        second = run_cli("run", "--overwrite", "--out", str(out), str(SCENARIOS / "pause.py"), timeout=60)
        assert second.returncode == 2 and "in use by a live run" in second.stderr, second.stderr[-2000:]
        assert (out / "manifest.json").is_file()  # and nothing of the live run was removed
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert stdout.strip(), stderr[-3000:]
    return proc.returncode, json.loads(stdout), stderr, out, pids


LONG = pytest.mark.skipif(not os.environ.get("DDPDOCTOR_LONG_TESTS"), reason="more of the same: DDPDOCTOR_LONG_TESTS=1")


@pytest.mark.parametrize(("command", "sig", "status"), [
    ("run", signal.SIGTERM, "stopped"),
    pytest.param("run", signal.SIGINT, "interrupted", marks=LONG),
    ("profile", signal.SIGTERM, "stopped"),
    ("check-sync", signal.SIGINT, "interrupted"),
])
def test_a_signal_stops_the_job_and_is_reported_as_what_it_is(tmp_path: Path, command: str, sig: int,
                                                                status: str) -> None:
    extra = ("--steps", "0") if command == "check-sync" else ("--wait", "0", "--warmup", "0", "--active", "2", "--run-to-completion") \
        if command == "profile" else ()
    code, report, stderr, out, pids = stop_with(tmp_path, command, sig, *extra)
    assert code == 128 + sig
    assert report["status"] == status
    assert report["stopped"]["signal"] == signal.Signals(sig).name
    ids = [f["id"] for f in report["findings"]]
    assert "job-stopped" in ids and "rank-crashed" not in ids and "rank-no-status" not in ids
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    stopped = next(f for f in report["findings"] if f["id"] == "job-stopped")
    assert ("preempted or time limit" in stopped["title"]) if sig == signal.SIGTERM else \
        ("Interrupted by the user" in stopped["title"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["finished"] is True and manifest["ended"]["how"] == "signal"
    # torchrun's SignalException traceback is in the run directory's log, not on the console (the ranks' own
    # lines, prefixed by torchrun's --tee, are the script's output and stay).
    assert "SignalException" not in stderr
    assert not [line for line in stderr.splitlines() if line.startswith("Traceback")]
    assert "SignalException" in (out / "torchrun" / "torchrun.log").read_text()
    assert not gone_within(pids, 5)
    if command == "profile":  # what was recorded before the stop is kept, and analyze still reads it
        assert list((out / "traces").glob("*.pt.trace.json*"))
        analyzed = run_cli("analyze", "--json", str(out), timeout=120)
        assert analyzed.returncode in (0, 1), analyzed.stderr[-2000:]
        assert json.loads(analyzed.stdout)["ranks"]


@pytest.mark.parametrize("sig", [signal.SIGHUP, pytest.param(signal.SIGQUIT, marks=LONG), signal.SIGKILL])
def test_no_orphans_whatever_ends_ddpdoctor(tmp_path: Path, sig: int) -> None:
    proc, out, mark = start(tmp_path, "run", "--no-json")  # the terminal report this time
    pids = wait_under_way(proc, mark)
    assert len(pids) >= 3  # torchrun and two ranks
    proc.send_signal(sig)
    stdout, _ = proc.communicate(timeout=120)
    if sig != signal.SIGKILL:
        assert f"ddpdoctor run: stopped: Stopped by {signal.Signals(sig).name}" in stdout
    assert proc.returncode == (-sig if sig == signal.SIGKILL else 128 + sig)
    assert not gone_within(pids, 10), "processes of the job outlived ddpdoctor"
    manifest = json.loads((out / "manifest.json").read_text())
    if sig == signal.SIGKILL:  # nothing of ddpdoctor ran: the manifest says it never finished, the lock is free
        from ddpdoctor.findings.job import ended_findings
        from ddpdoctor.launch.runlock import is_locked

        assert manifest["ended"]["how"] == "running" and not is_locked(out)
        from ddpdoctor.rundir.layout import RunDir
        from ddpdoctor.rundir.manifest import load_typed

        (finding,), _ = ended_findings(load_typed(RunDir(out)), locked=is_locked(out))
        assert finding.id == "run-unfinished"
    else:
        assert manifest["ended"] == {"how": "signal", "signal": signal.Signals(sig).name, "signum": sig,
                                     "exit_code": 128 + sig}


def test_preflight_workers_do_not_outlive_a_killed_ddpdoctor(tmp_path: Path) -> None:
    # A 1 GiB all_reduce sweep over gloo keeps the workers busy for many seconds; SIGKILL gives ddpdoctor no chance
    # to clean up, torchrun dies of its parent-death signal, and the workers must die of their own.
    args = [sys.executable, "-m", "ddpdoctor", "preflight", "--nproc-per-node", "2", "--backend", "gloo",
            "--max-size", "1G", "--out", str(tmp_path / "pf")]
    proc = subprocess.Popen(args, cwd=REPO, env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline, pids = time.time() + 90, set()
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        pids = descendants(proc.pid)
        workers = [p for p in pids if "preflight/worker.py" in _cmdline(p)]
        if len(workers) >= 2 and (tmp_path / "pf" / "ranks" / "rank1" / "preflight.json").exists():
            break
        time.sleep(0.2)
    else:
        pytest.fail("the preflight workers never started")
    proc.kill()
    proc.communicate(timeout=60)
    # The kernel's parent-death signals act at once; a worker without one lives on in the sweep until its next store
    # call fails (measured: 7 s and more), so 3 s tells the two apart.
    assert not gone_within(pids, 3), "preflight workers outlived ddpdoctor"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""

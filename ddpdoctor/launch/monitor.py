"""The heartbeat monitor (a JobWatcher): receives every rank's heartbeat on 127.0.0.1, detects a hang, diagnoses it.

On a hang it collects each rank's Python stack (py-spy when it can attach, else the heartbeat thread's own dump,
else the faulthandler signal), the heartbeat state and each rank's Flight Recorder dump, names the culprit
(ddpdoctor.findings.hang), writes RUN/hang.json and RUN/hang.txt, then kills the job or leaves it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ddpdoctor.findings.hang import diagnose_hang, position
from ddpdoctor.rundir.layout import write_json

if TYPE_CHECKING:
    from ddpdoctor.launch.launcher import LaunchSpec, RunningJob

MIN_HANG_TIMEOUT_S = 60.0
STEP_MULTIPLE = 10.0
KILL_GRACE_S = 3.0


def auto_hang_timeout(slowest_step_s: float | None) -> float:
    """The default --hang-timeout: max(60 s, 10x the slowest step seen so far)."""
    return max(MIN_HANG_TIMEOUT_S, STEP_MULTIPLE * (slowest_step_s or 0.0))


@dataclass
class RankLink:
    rank: int
    pid: int | None = None
    stacks_file: str | None = None
    beat: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None
    dump: dict[str, Any] | None = None
    conn: socket.socket | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class HangMonitor:
    """JobWatcher for launch(): hang-timeout None means the automatic one (auto_hang_timeout)."""

    def __init__(self, hang_timeout: float | None = None, startup_timeout: float = 600.0, on_hang: str = "kill") -> None:
        self.hang_timeout = hang_timeout
        self.startup_timeout = startup_timeout
        self.on_hang = on_hang
        self.links: dict[int, RankLink] = {}
        self.world_size: int | None = None
        self.hang: dict[str, Any] | None = None
        self.run_root: Path | None = None
        self._server: socket.socket | None = None
        self._lock = threading.Lock()
        self._kill_at: float | None = None
        self._stopped = threading.Event()
        self.live: Any = None  # ddpdoctor.live.watch.LiveWatch (h18): live health, captures; set by the command

    # -- JobWatcher ----------------------------------------------------------------------------------
    def start(self, spec: LaunchSpec) -> str | None:
        self.run_root = spec.run_dir.root
        # A reused run directory must not show the last run's hang or rank statuses as this run's.
        for old in ("hang.json", "hang.txt", "heartbeats.json"):
            (self.run_root / old).unlink(missing_ok=True)
        for rank in spec.run_dir.ranks_present():
            for old in ("status.json", "stacks.txt"):
                spec.run_dir.rank_file(rank, old).unlink(missing_ok=True)
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", 0))  # loopback only: heartbeats carry stacks and paths
        srv.listen(256)
        self._server = srv
        threading.Thread(target=self._accept, name="ddpdoctor-monitor", daemon=True).start()
        if self.live is not None:
            self.live.start(self, self.run_root)
        return f"127.0.0.1:{srv.getsockname()[1]}"

    def check(self, job: RunningJob) -> None:
        now = time.time()
        if self.live is not None:
            self.live.check(now)
        if self.hang is not None:
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_at = None
                self._kill_all(job, signal.SIGKILL)
            return
        stalled = self.stalled_ranks(now, job.started)
        if stalled:
            self._on_hang(job, stalled, now)

    def stop(self, job: RunningJob) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        if self.live is not None:
            self.live.stop()
        if self.run_root is not None:
            beats = {str(r): {"beat": lk.beat, "exit": lk.exit} for r, lk in sorted(self.links.items())}
            try:
                write_json(self.run_root / "heartbeats.json", {"world_size": self.world_size, "ranks": beats})
            except OSError:
                pass

    # -- detection -----------------------------------------------------------------------------------
    def effective_hang_timeout(self) -> float:
        if self.hang_timeout is not None:
            return self.hang_timeout
        slowest = max((lk.beat or {}).get("max_step_s") or 0.0 for lk in self.links.values()) if self.links else 0.0
        return auto_hang_timeout(slowest)

    def stalled_ranks(self, now: float, job_started: float) -> list[int]:
        """Ranks still running whose step has not advanced within the timeout (start-up: --startup-timeout)."""
        with self._lock:
            links = dict(self.links)
        live = {r: lk for r, lk in links.items() if lk.exit is None}
        if not links:
            return [-1] if now - job_started > self.startup_timeout else []
        if self.world_size and len(links) < self.world_size and now - job_started > self.startup_timeout:
            return sorted(set(range(self.world_size)) - set(links))
        timeout = self.effective_hang_timeout()
        stalled = []
        for r, lk in live.items():
            beat = lk.beat or {}
            step = beat.get("step", 0)
            since = job_started if not step else beat.get("step_started", now)
            if now - since > (self.startup_timeout if not step else timeout):
                stalled.append(r)
        return sorted(stalled)

    # -- diagnosis -----------------------------------------------------------------------------------
    def _on_hang(self, job: RunningJob, stalled: list[int], now: float) -> None:
        timeout = self.effective_hang_timeout()
        with self._lock:
            links = dict(self.links)
        started = [(lk.beat or {}).get("step_started") for r, lk in links.items() if r in stalled and (lk.beat or {}).get("step")]
        last_progress = max([s for s in started if s] or [job.started])
        stacks, dumps = self.collect(links)
        ranks = range(self.world_size) if self.world_size else sorted(links)
        positions = {r: position(r, links[r].beat if r in links else None, links[r].exit if r in links else None)
                     for r in ranks}
        diagnosis = diagnose_hang(positions, [r for r in stalled if r >= 0])
        self.hang = {
            "detected_after_s": round(now - last_progress, 2),
            "hang_timeout_s": timeout,
            "startup_timeout_s": self.startup_timeout,
            "in_startup": all(not (lk.beat or {}).get("step") for lk in links.values()),
            "on_hang": self.on_hang,
            "diagnosis": diagnosis.to_json(),
            "stacks": {str(r): s for r, s in stacks.items()},
            "heartbeats": {str(r): lk.beat for r, lk in links.items()},
            "flight_recorder": {str(r): d for r, d in dumps.items()},
        }
        # Detection plus collecting stacks and dumps: what the "within hang-timeout + 5 s" bounds.
        self.hang["reported_after_s"] = round(time.time() - last_progress, 2)
        if self.run_root is not None:
            write_json(self.run_root / "hang.json", self.hang)
            (self.run_root / "hang.txt").write_text(hang_text(self.hang))
        click.echo(f"ddpdoctor: hang detected ({diagnosis.reason}); report in {self.run_root}/hang.txt", err=True)
        if self.on_hang == "kill":
            self._kill_all(job, signal.SIGTERM)
            self._kill_at = time.time() + KILL_GRACE_S

    def collect(self, links: dict[int, RankLink]) -> tuple[dict[int, str | None], dict[int, Any]]:
        """Every live rank's stack (py-spy, else heartbeat dump, else faulthandler) and Flight Recorder dump."""
        live = {r: lk for r, lk in links.items() if lk.exit is None}
        for lk in live.values():
            lk.dump = None
            self._request(lk, "dump")
        spy: dict[int, str | None] = {}  # None: py-spy missing or could not attach
        threads = [threading.Thread(target=lambda r=r, lk=lk: spy.__setitem__(r, py_spy_dump(lk.pid)))
                   for r, lk in live.items() if lk.pid]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        deadline = time.time() + 5
        while time.time() < deadline and any(lk.dump is None for lk in live.values() if lk.conn is not None):
            time.sleep(0.05)
        stacks: dict[int, str | None] = {}  # None: every way failed; hang_text says so
        dumps: dict[int, Any] = {}
        for r, lk in live.items():
            dump = lk.dump or {}
            dumps[r] = dump.get("flight_recorder")
            stacks[r] = spy.get(r) or dump.get("stacks") or faulthandler_dump(lk.pid, lk.stacks_file)
        return stacks, dumps

    def _kill_all(self, job: RunningJob, sig: int) -> None:
        job.kill("hang", sig)
        for lk in self.links.values():
            if lk.pid and lk.exit is None:
                try:
                    os.kill(lk.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    # -- transport -----------------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopped.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        link: RankLink | None = None
        buf = b""
        with conn:
            while True:
                try:
                    data = conn.recv(1 << 16)
                except OSError:
                    break
                if not data:
                    break
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        continue
                    link = self._handle(msg, conn, link)
        if link is not None and link.exit is None:
            link.conn = None
            # The connection closed without an exit message: the process died (signal, OOM killer).
            if link.pid and not _alive(link.pid):
                link.exit = {"exit_code": None, "exception": "died without a status (signal or OOM killer?)"}

    def _handle(self, msg: dict[str, Any], conn: socket.socket, link: RankLink | None) -> RankLink | None:
        kind = msg.get("type")
        if kind == "hello":
            with self._lock:
                link = self.links.setdefault(int(msg["rank"]), RankLink(int(msg["rank"])))
                link.pid, link.stacks_file, link.conn = msg.get("pid"), msg.get("stacks_file"), conn
                if msg.get("world_size"):
                    self.world_size = int(msg["world_size"])
        elif link is None:
            return None
        elif kind == "beat":
            if self.live is not None:
                self.live.message(link.rank, msg)  # takes the beat's iteration records out of it
            link.beat = msg
        elif kind == "enter":
            link.beat = dict(link.beat or {"rank": link.rank, "step": 0}, collective=msg.get("collective"))
        elif kind == "dump":
            link.dump = msg
        elif kind == "exit":
            link.exit = msg.get("status") or {}
        elif kind == "capture" and self.live is not None:
            self.live.message(link.rank, msg)
        return link

    @staticmethod
    def _request(link: RankLink, what: str) -> None:
        if link.conn is None:
            return
        try:
            with link.lock:
                link.conn.sendall(what.encode() + b"\n")
        except OSError:
            link.conn = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def py_spy_dump(pid: int | None, timeout: float = 8.0) -> str | None:
    """`py-spy dump --pid PID`, or None when py-spy is missing or cannot attach (no ptrace)."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not pid or not Path(exe).exists():
        return None
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def faulthandler_dump(pid: int | None, stacks_file: str | None, wait_s: float = 1.5) -> str | None:
    """Ask the rank's faulthandler (registered by the heartbeat probe) to write all its threads' stacks."""
    if not pid or not stacks_file:
        return None
    try:
        os.kill(pid, signal.SIGUSR2)
    except (ProcessLookupError, PermissionError):
        return None
    deadline = time.time() + wait_s
    path = Path(stacks_file)
    while time.time() < deadline:
        try:
            text = path.read_text()
        except OSError:
            text = ""
        if text.strip():
            return text
        time.sleep(0.1)
    return None


def hang_text(hang: dict[str, Any]) -> str:
    """RUN/hang.txt: what hung, the culprit, each rank's position and stack."""
    d = hang["diagnosis"]
    lines = [
        f"HANG detected after {hang['detected_after_s']} s without progress (hang timeout {hang['hang_timeout_s']} s)",
        f"diagnosis: {d['kind']}: {d['reason']}",
        f"culprit rank(s): {d['culprit_ranks'] or 'undetermined'}; stalled rank(s): {d['stalled_ranks']}",
        "",
    ]
    for r, p in sorted(d["positions"].items(), key=lambda kv: int(kv[0])):
        where = f"{p['op']} #{p['seq']} on {p['group']} sizes {p['sizes']}" if p["state"] == "in-collective" else p["state"]
        lines.append(f"rank {r}: {where}; phase {p['phase']}; step {p['step']}; at {p['call_site']}")
    for r, s in sorted(hang.get("stacks", {}).items(), key=lambda kv: int(kv[0])):
        lines += ["", f"--- rank {r} stack ---", s or "(no stack: py-spy, the heartbeat thread and faulthandler all failed)"]
    return "\n".join(lines) + "\n"


def make_watcher(hang_timeout: float | None, startup_timeout: float, on_hang: str) -> HangMonitor:
    """The watcher every launching command passes to launch(); BadInput for a timeout that is not positive."""
    from ddpdoctor.errors import BadInput

    if hang_timeout is not None and not hang_timeout > 0:
        raise BadInput(f"--hang-timeout must be a positive number of seconds, not {hang_timeout}")
    if not startup_timeout > 0:
        raise BadInput(f"--startup-timeout must be a positive number of seconds, not {startup_timeout}")
    return HangMonitor(hang_timeout=hang_timeout, startup_timeout=startup_timeout, on_hang=on_hang)


def pop_watcher(kwargs: dict[str, Any]) -> HangMonitor:
    """The watcher of the --hang-timeout/--startup-timeout/--on-hang values `watch_options` added to ``kwargs``."""
    return make_watcher(kwargs.pop("hang_timeout"), kwargs.pop("startup_timeout"), kwargs.pop("on_hang"))


def watch_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--hang-timeout, --startup-timeout, --on-hang (pass them to make_watcher)."""
    fn = click.option("--on-hang", type=click.Choice(["kill", "report"]), default="kill", show_default=True,
                      help="After a hang is reported: kill the job, or leave it running.")(fn)
    fn = click.option("--startup-timeout", type=float, default=600.0, show_default=True,
                      help="Seconds allowed for start-up and the first step before it counts as a hang.")(fn)
    fn = click.option("--hang-timeout", type=float, default=None,
                      help="Seconds without a step before a rank is hung [default: max(60, 10x slowest step)].")(fn)
    return fn

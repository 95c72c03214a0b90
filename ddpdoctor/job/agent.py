"""One node's part in watching the whole job: publish this node's ranks through the job store; on the head, read every
node's state and decide (hang, culprit, lost node, crash root) with job/state.py's rules; at the end, gather the
ranks' files and hand every node the head's one verdict.

The node's HangMonitor calls check() from the launcher's poll loop and finish() once the job ended; everything
else runs on one publishing thread."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ddpdoctor.job import grouping, state
from ddpdoctor.job.role import JobRole
from ddpdoctor.job.store import JobStore, JobStoreError, job_port, shared_token

if TYPE_CHECKING:
    from ddpdoctor.launch.launcher import RunningJob
    from ddpdoctor.launch.monitor import HangMonitor

PUBLISH_S = 1.0  # a beat about once a second, at once on a change that matters
TICK_S = 0.1
POLL_S = 0.5
STACKS_WAIT_S = 12.0  # for the other nodes' stacks after a hang (py-spy may take seconds per rank)
READ_EVERY_S = 0.5  # the head reads every node's state this often (each read parses the whole job's records)
END_WAIT_S = 60.0  # the head waits this long for every node to finish; the others for the head's verdict
RANK_FILES = ("status.json", "info.json", "summary.json")
STDERR_TAIL = 16 << 10


@dataclass
class Outcome:
    """How this node ends: the job's exit code, whether this node reports, and the line the others print."""

    code: int
    reports: bool
    line: str | None = None


class JobAgent:
    def __init__(self, role: JobRole, monitor: HangMonitor, run_root: Path) -> None:
        self.role, self.monitor, self.run_root = role, monitor, run_root
        self.host = socket.gethostname()
        self.store: JobStore | None = None
        self.nodes: dict[int, state.NodeState] = {n: state.NodeState(n) for n in range(role.nnodes)}
        self.verdict: dict[str, Any] | None = None
        self.seq = 0
        self.end: int | None = None
        self._stop = threading.Event()
        self._answered: set[int] = set()
        self._thread: threading.Thread | None = None
        self._job_started = time.time()
        self._read_at = 0.0
        token = shared_token(run_root, role.key)
        port = job_port(role.master_port)
        if role.is_head:
            # Hosted before the job starts, so every node finds it as soon as it looks.
            self.store = JobStore(role.master_addr, port, token, is_head=True)
        self._token, self._port = token, port

    @property
    def is_head(self) -> bool:
        return self.role.is_head

    def start(self, job_started: float) -> None:
        self._job_started = job_started
        self._thread = threading.Thread(target=self._loop, name="ddpdoctor-job", daemon=True)
        self._thread.start()

    # -- every node: publish -------------------------------------------------------------------------
    def _records(self) -> list[dict[str, Any]]:
        now = time.time()
        links = dict(self.monitor.links)
        # Once this node's job ended, a rank that never said how it ended died (a signal, an abort in C++).
        died = {"exit_code": None, "exception": "died without a status (killed by a signal, or aborted)"}
        return [state.record(r, lk.beat, lk.exit or (died if self.end is not None else None), now, self._job_started)
                for r, lk in sorted(links.items())]

    def _signature(self) -> tuple[Any, ...]:
        return tuple((r, (lk.beat or {}).get("step"), (lk.beat or {}).get("phase"),
                      ((lk.beat or {}).get("collective") or {}).get("seq"), lk.exit is not None)
                     for r, lk in sorted(dict(self.monitor.links).items()))

    def publish(self) -> None:
        if self.store is None:
            return
        self.seq += 1
        env = state.envelope(self.role.node_rank, self.host, self.seq, self._records(), self.end)
        self.store.put(f"node/{self.role.node_rank}", env)

    def _connect(self) -> None:
        while self.store is None and not self._stop.is_set():
            try:
                self.store = JobStore(self.role.master_addr, self._port, self._token, is_head=False,
                                      connect_timeout_s=5.0)
            except JobStoreError:
                self._stop.wait(1.0)

    def _loop(self) -> None:
        self._connect()
        next_beat, next_poll, sent = 0.0, 0.0, None
        while not self._stop.is_set():
            now = time.time()
            sig = self._signature()
            try:
                if now >= next_beat or sig != sent:
                    self.publish()
                    sent, next_beat = sig, now + PUBLISH_S
                if not self.is_head and now >= next_poll:
                    # The head's requests (stacks after a hang) and verdict: twice a second, two small requests.
                    self._poll_head()
                    next_poll = now + POLL_S
            except (RuntimeError, OSError, ValueError):
                pass  # the head went away or is restarting: keep the ranks watched locally, try again
            self._stop.wait(TICK_S)

    def _poll_head(self) -> None:
        assert self.store is not None
        got = self.store.get_many(["req", "verdict"])
        req = got.get("req")
        if isinstance(req, dict) and isinstance(req.get("id"), int) and req["id"] not in self._answered:
            self._answered.add(req["id"])
            stacks, _ = self.monitor.collect(dict(self.monitor.links))
            self.store.put(f"stacks/{self.role.node_rank}", {str(r): _tail(s) for r, s in stacks.items()})
        if isinstance(got.get("verdict"), dict) and self.verdict is None:
            self.verdict = got["verdict"]

    # -- the monitor's hooks ---------------------------------------------------------------------------
    def on_start(self, monitor: HangMonitor) -> None:
        self.start(time.time())

    def decide(self, monitor: HangMonitor, job: RunningJob, now: float) -> None:
        """HangMonitor.decider: the head decides for the job; another node acts on the head's verdict."""
        if self.is_head:
            self._decide(job)
        elif self.verdict is not None and monitor.hang is None:
            monitor.declare(job, {"remote": True, **self.verdict}, str(self.verdict.get("line")))

    def read_nodes(self) -> None:
        """Refresh every node's state from the store (the head's view of the job)."""
        if self.store is None:
            return
        now = time.time()
        got = self.store.get_many([f"node/{n}" for n in self.nodes])
        for name, env in got.items():
            if isinstance(env, dict) and env.get("v") == state.VERSION:
                self.nodes[int(name.split("/")[1])].update(env, now)

    def hang_timeout(self) -> float:
        from ddpdoctor.launch.monitor import auto_hang_timeout

        t = self.monitor.hang_timeout
        return t if t is not None else auto_hang_timeout(state.slowest_step(self.nodes))

    def _world_size(self) -> int | None:
        sizes = [self.monitor.world_size] if self.monitor.world_size else []
        return max(sizes) if sizes else None

    def _decide(self, job: RunningJob) -> None:
        if time.time() - self._read_at < READ_EVERY_S:
            return
        self._read_at = time.time()
        try:
            self.read_nodes()
        except (RuntimeError, OSError, ValueError):
            return
        now = time.time()
        timeout = self.hang_timeout()
        for n in state.lost_nodes(self.nodes, now, after_s=timeout):
            self.nodes[n].lost = True
        lost = [n for n, st in self.nodes.items() if st.lost]
        never = [n for n, st in self.nodes.items() if st.seq < 0]
        stalled = state.stalled_ranks(self.nodes, now, timeout, self.monitor.startup_timeout)
        if never and now - job.started > self.monitor.startup_timeout:
            for n in never:
                self.nodes[n].lost = True
            lost += never
        if stalled or lost:
            self._on_hang(job, stalled, now, timeout)

    def _on_hang(self, job: RunningJob, stalled: list[int], now: float, timeout: float) -> None:
        assert self.store is not None
        d = state.diagnose(self.nodes, self._world_size(), stalled)
        pos, node_of = state.positions(self.nodes, self._world_size())
        live = [n for n, st in self.nodes.items() if not st.lost and st.end is None and n != self.role.node_rank]
        self.store.put("req", {"id": 1, "what": "stacks"})
        stacks, dumps = self.monitor.collect(dict(self.monitor.links))
        deadline = time.time() + STACKS_WAIT_S
        remote: dict[str, Any] = {}
        while time.time() < deadline and len(remote) < len(live):
            try:
                remote.update(self.store.get_many([f"stacks/{n}" for n in live if f"stacks/{n}" not in remote]))
            except (RuntimeError, OSError):
                break
            time.sleep(0.2)
        all_stacks: dict[int, str | None] = {r: _tail(s) for r, s in stacks.items()}
        for per in remote.values():
            if isinstance(per, dict):
                all_stacks.update({int(r): s for r, s in per.items() if str(r).isdigit() and isinstance(s, str)})
        classes = grouping.group(pos, all_stacks, node_of)
        line = f"job hung: {d.reason}"
        if d.culprit_ranks:
            line = f"job hung: culprit rank(s) {grouping.rank_ranges(d.culprit_ranks)}: {d.reason}"
        ages = [state.rank_age(r, st, now) for st in self.nodes.values() for r in st.ranks if r["r"] in stalled]
        detected = round(max(ages), 2) if ages else round(timeout, 2)
        hang: dict[str, Any] = {
            "detected_after_s": detected,
            "hang_timeout_s": timeout, "startup_timeout_s": self.monitor.startup_timeout,
            "in_startup": all(not r.get("s") for st in self.nodes.values() for r in st.ranks),
            "on_hang": self.monitor.on_hang, "diagnosis": d.to_json(),
            "stacks": {str(r): s for r, s in all_stacks.items()},
            "classes": [c.to_json() for c in classes],
            "nodes": {str(n): {"host": st.host, "lost": st.lost, "ranks": grouping.rank_ranges(r["r"] for r in st.ranks)}
                      for n, st in self.nodes.items()},
            "flight_recorder": {str(r): v for r, v in dumps.items()},
        }
        hang["reported_after_s"] = round(detected + time.time() - now, 2)
        verdict = {"line": line, "code": 1, "on_hang": self.monitor.on_hang, "head": self.host,
                   "report": str(self.run_root / "hang.txt")}
        self.verdict = verdict
        self.store.put("verdict", verdict)
        self.monitor.declare(job, hang, f"{line}; report in {self.run_root}/hang.txt",
                             extra_text=grouping.render(classes))

    # -- the end ---------------------------------------------------------------------------------------
    def finish(self, run_root: Path, code: int) -> Outcome:
        """This node's job ended with ``code``: publish it with the ranks' files; the head waits for every node,
        writes the files it lacks (no shared filesystem) and tells every node the job's verdict."""
        self.end = code
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.store is None:
            self._connect_once()
        if self.store is None:
            return Outcome(1 if code else 0, self.is_head, "the job store was unreachable: this node saw only its "
                           "own ranks")
        try:
            self.publish()
            self.store.put(f"files/{self.role.node_rank}", self._rank_files(run_root))
        except (RuntimeError, OSError):
            pass
        return self._finish_head(run_root, code) if self.is_head else self._finish_node(code)

    def _connect_once(self) -> None:
        try:
            self.store = JobStore(self.role.master_addr, self._port, self._token, is_head=False, connect_timeout_s=5.0)
        except JobStoreError:
            self.store = None

    def _rank_files(self, run_root: Path) -> dict[str, dict[str, str]]:
        out: dict[str, dict[str, str]] = {}
        for r in self.monitor.links:
            rdir = run_root / "ranks" / f"rank{r}"
            files = {}
            for name in RANK_FILES:
                try:
                    files[name] = (rdir / name).read_text()
                except (OSError, UnicodeDecodeError):
                    continue
            try:
                files["stderr.log"] = (rdir / "stderr.log").read_bytes()[-STDERR_TAIL:].decode("utf-8", "replace")
            except OSError:
                pass
            out[str(r)] = files
        return out

    def _finish_node(self, code: int) -> Outcome:
        assert self.store is not None
        deadline = time.time() + END_WAIT_S + 30
        while time.time() < deadline:
            try:
                final = self.store.get("final")
            except (RuntimeError, OSError):
                break  # the head is gone
            if isinstance(final, dict) and isinstance(final.get("code"), int):
                try:
                    self.store.put(f"ack/{self.role.node_rank}", 1)
                except (RuntimeError, OSError):
                    pass
                return Outcome(final["code"], False, f"{final.get('line')}; the job's report is on the head node "
                               f"({final.get('head')}) in {final.get('report')}")
            time.sleep(0.3)
        return Outcome(1 if code else 0, False, f"the head node did not answer; this node's ranks ended with {code}")

    def _finish_head(self, run_root: Path, code: int) -> Outcome:
        assert self.store is not None
        deadline = time.time() + END_WAIT_S
        while time.time() < deadline:
            try:
                self.read_nodes()
            except (RuntimeError, OSError):
                break
            now = time.time()
            for n in state.lost_nodes(self.nodes, now, after_s=min(15.0, self.hang_timeout())):
                self.nodes[n].lost = True
            if all(st.end is not None or st.lost for st in self.nodes.values()):
                break
            time.sleep(0.3)
        files = self.store.get_many([f"files/{n}" for n in self.nodes if n != self.role.node_rank])
        write_missing(run_root, files)
        codes = [st.end for st in self.nodes.values() if st.end is not None]
        lost = [n for n, st in self.nodes.items() if st.lost or st.end is None]
        job_code = code or next((c for c in codes if c), 0) or (1 if lost else 0)
        line = self._summary(job_code, lost)
        self.store.put("final", {"code": 1 if job_code else 0, "line": line, "head": self.host,
                                 "report": str(run_root / "report.txt")})
        waiting = [n for n in self.nodes if n != self.role.node_rank and n not in lost]
        ack_deadline = time.time() + 15
        while waiting and time.time() < ack_deadline:
            got = self.store.get_many([f"ack/{n}" for n in waiting])
            waiting = [n for n in waiting if f"ack/{n}" not in got]
            time.sleep(0.2)
        if self.verdict is None:  # a hang verdict was said when it was declared
            click.echo(f"ddpdoctor: {line}", err=True)
        return Outcome(job_code, True, line)

    def _summary(self, code: int, lost: list[int]) -> str:
        """The job's one line: the head's hang verdict, else a lost node, else the crash's root cause."""
        if self.verdict is not None:
            return str(self.verdict["line"])
        from ddpdoctor.findings.hang import is_victim

        st = state.statuses(self.nodes)
        roots = [r for r in state.crash_root(self.nodes)
                 if not (lost and is_victim(str((st.get(r) or {}).get("exception"))))]
        if lost:
            hosts = ", ".join(f"node {n} ({self.nodes[n].host})" for n in lost)
            ranks = grouping.rank_ranges(r["r"] for n in lost for r in self.nodes[n].ranks)
            line = f"job failed: {hosts} stopped publishing (its launcher or host died): rank(s) {ranks} lost"
            return line + (f"; rank(s) {grouping.rank_ranges(roots)} failed" if roots else "")
        if roots:
            first = st.get(roots[0]) or {}
            exc = str(first.get("exception") or "").splitlines()[0][:200] if first.get("exception") else ""
            return f"job failed: rank(s) {grouping.rank_ranges(roots)} failed first: {exc}"
        return f"job failed (exit code {code})" if code else "job finished ok"


def _tail(stack: str | None, lines: int = 80) -> str | None:
    if not stack:
        return stack
    return "\n".join(stack.splitlines()[-lines:])[-16000:]


def write_missing(run_root: Path, files: dict[str, Any]) -> None:
    """Write the ranks' files gathered through the store that the run directory lacks (no shared filesystem)."""
    for per_node in files.values():
        if not isinstance(per_node, dict):
            continue
        for r, per_rank in per_node.items():
            if not str(r).isdigit() or not isinstance(per_rank, dict):
                continue
            rdir = run_root / "ranks" / f"rank{int(r)}"
            for name, text in per_rank.items():
                if name not in (*RANK_FILES, "stderr.log") or not isinstance(text, str):
                    continue
                path = rdir / name
                if not path.exists():
                    rdir.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)


def attach_agent(role: JobRole, watcher: Any, run_root: Path) -> JobAgent | None:
    """Hook the job layer into this node's monitor (HangMonitor.plugins and .decider); None without a monitor.
    A job store that cannot be hosted or a foreign token file is bad input (one line, exit 2)."""
    from ddpdoctor.errors import BadInput
    from ddpdoctor.launch.monitor import HangMonitor

    watcher = getattr(watcher, "inner", watcher)  # the progress display wraps the monitor on a terminal
    if not isinstance(watcher, HangMonitor):
        return None
    try:
        agent = JobAgent(role, watcher, run_root)
    except JobStoreError as exc:
        raise BadInput(str(exc), run_root) from exc
    watcher.plugins.append(agent)
    watcher.decider = agent.decide
    watcher.writes_run_files = role.is_head
    return agent

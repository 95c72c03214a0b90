"""The heartbeat monitor (a JobWatcher): receives every rank's heartbeat on 127.0.0.1, detects a hang, diagnoses it.

Transport: launch/transport.py (one event loop, a per-job token, bounded sizes). The monitor turns what it knows of
each rank (its messages, its training thread's CPU and I/O from /proc) into one typed record (job/record.py) and
judges them with the job's one stall rule (job/rules.py): a laggard outside any collective whose training thread
keeps working is a long stall (reported, watched on), a stuck one is a hang. A job of several nodes gives the
judging to the job layer (``decider``, job/agent.py), which sees this node only through its port: ``records``,
``collect_stacks``, ``note_stalls``, ``act``, ``replay``, ``say``.

On a hang it collects each rank's Python stack (launch/stacks.py), the heartbeat state and each rank's Flight
Recorder dump, names the culprit (ddpdoctor.findings.hang), writes RUN/hang.json and RUN/hang.txt (owner-only),
then kills the job or leaves it. It signals only processes of the tree it started (launch/proctree.py).

Plugins (the multi-node job layer, live health) hook in through ``HangMonitor.plugins``: objects with any of
``on_start(monitor)``, ``on_message(monitor, rank, msg)`` (loop thread), ``on_tick(monitor, now)`` (the launcher's
poll loop, ~10/s) and ``on_stop(monitor)``; ``snapshot()`` gives every rank's state as plain data and
``send(rank, msg)`` asks a rank something (its heartbeat thread answers, see probes/heartbeat.py)."""

from __future__ import annotations

import json
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

from ddpdoctor.job.capture_relay import CaptureRequest, capture_request
from ddpdoctor.job.record import LongStall, RankRecord, record
from ddpdoctor.job.rules import (
    CRASH_GRACE_S,
    MIN_HANG_TIMEOUT_S,
    STEP_MULTIPLE,
    STUCK_S,
    HangGate,
    Limits,
    StallDecision,
    auto_hang_timeout,
    decide,
    effective_timeout,
    is_busy,
    just_moved,
)
from ddpdoctor.job.state import NodeState
from ddpdoctor.job.verdict import RemoteVerdict, build
from ddpdoctor.jsontypes import JsonValue
from ddpdoctor.launch.proctree import activity, children_activity, in_tree, signal_own, waits_on_children
from ddpdoctor.launch.stacks import faulthandler_dump, py_spy_dump
from ddpdoctor.launch.transport import TOKEN_ENV, Listener
from ddpdoctor.rundir.layout import RunDir, write_json, write_private_text
from ddpdoctor.rundir.records import (
    Beat,
    HangDoc,
    HeartbeatsDoc,
    MonitorDoc,
    RankBeatsDoc,
    RankExitDoc,
    RankMessage,
)

if TYPE_CHECKING:
    from ddpdoctor.launch.spec import LaunchSpec, RunningJob

KILL_GRACE_S = 3.0
MAX_WORLD = 1 << 20
ACTIVITY_EVERY_S = 1.0
__all__ = ["CRASH_GRACE_S", "MIN_HANG_TIMEOUT_S", "STEP_MULTIPLE", "STUCK_S", "auto_hang_timeout"]


# A rank that sent its exit message and is still alive this long after is watched for a teardown hang.
TEARDOWN_SAMPLE_S = 1.0


@dataclass
class RankLink:
    rank: int
    pid: int | None = None  # as the rank said; acted on only after proctree.in_tree confirms it
    beat: Beat | None = None  # its last beat, with the "enter" and "backward" lines since folded in
    exit: RankExitDoc | None = None
    dump: RankMessage | None = None  # its answer to the last "dump" request
    last_seen: float | None = None
    heartbeat_tid: int | None = None  # the heartbeat thread's own CPU and I/O do not count as the rank's
    main_tid: int | None = None  # the training thread: its own CPU and I/O are what "busy" means
    active_at: float | None = None  # last time its CPU, I/O or Python position changed
    moved_at: float | None = None  # last time its messages showed a new position (step, phase, collective)
    activity: tuple[int, int] | None = None
    exit_at: float | None = None


class RankSnapshot(TypedDict):
    """One rank's state as the monitor's plugins see it (snapshot())."""

    rank: int
    beat: Beat | None
    exit: RankExitDoc | None
    last_seen: float | None
    active_at: float | None
    connected: bool


class MonitorRequest(TypedDict, total=False):
    """What the monitor asks a rank (its heartbeat thread answers with a message of the same ``type``): "dump"
    (its stacks and Flight Recorder dump) or "capture" (a profiler window, probes/live.py)."""

    type: str
    id: str
    what: str
    steps: int
    at_step: int


def expected_world(spec: LaunchSpec) -> int | None:
    """The world size this launch starts (None when torchrun decides: gpu/auto, elastic MIN:MAX)."""
    if spec.launcher == "none":
        from ddpdoctor.probes.config import rank_from_env

        return rank_from_env()[1]
    nproc = str(spec.torchrun.get("--nproc-per-node") or "1")
    nnodes = str(spec.torchrun.get("--nnodes") or "1")
    return int(nproc) * int(nnodes) if nproc.isdigit() and nnodes.isdigit() else None


class HangMonitor:
    """JobWatcher for launch(): hang-timeout None means the automatic one (auto_hang_timeout)."""

    def __init__(self, hang_timeout: float | None = None, startup_timeout: float = 600.0, on_hang: str = "kill") -> None:
        self.hang_timeout = hang_timeout
        self.startup_timeout = startup_timeout
        self.on_hang = on_hang
        self.links: dict[int, RankLink] = {}
        self.world_size: int | None = None
        self.hang: HangDoc | RemoteVerdict | None = None  # a node acting on the head's verdict holds the head's word
        self.run_root: Any = None
        self.run_dir: RunDir | None = None
        self.token = secrets.token_hex(32)  # handed to the ranks in their environment only (rank_env)
        self.plugins: list[Any] = []
        self.stalls: dict[tuple[int, int], LongStall] = {}  # (rank, step) -> long-stall record
        self.plugin_errors = 0
        self.root_pid: int | None = None  # the process ddpdoctor started (torchrun, or the rank itself)
        self.listener: Listener | None = None
        self._expected_world: int | None = None
        self._lock = threading.Lock()
        self._kill_at: float | None = None
        self._lingering: set[int] = set()  # pids of ranks that finished and never exited (_check_teardown)
        self._quiet: dict[int, tuple[object, float]] = {}  # rank -> (its main thread's activity, since when)
        self._activity_at = 0.0
        self._job: RunningJob | None = None
        self.changes = 0  # counts changes of a rank's place or exit (the job layer publishes at once on one)
        # Multi-node (ddpdoctor/job): decider(monitor, job, now) decides hangs for the whole job instead of this
        # node's rules; writes_run_files is False on the job's other nodes (the head writes hang and heartbeats).
        self.decider: Callable[[HangMonitor, RunningJob, float], None] | None = None
        self.writes_run_files = True
        self.gate = HangGate()  # a hang holds on a second, newer view before it is declared (job/rules.py)

    # -- JobWatcher ----------------------------------------------------------------------------------
    def start(self, spec: LaunchSpec) -> str | None:
        self.run_root = spec.run_dir.root
        self.run_dir = spec.run_dir
        self._expected_world = expected_world(spec)
        # A reused run directory must not show the last run's hang or rank statuses as this run's.
        for old in ("hang.json", "hang.txt", "heartbeats.json") if self.writes_run_files else ():
            (self.run_root / old).unlink(missing_ok=True)
        for rank in spec.run_dir.ranks_present() if self.writes_run_files else ():
            for old in ("status.json", "stacks.txt"):
                spec.run_dir.rank_file(rank, old).unlink(missing_ok=True)
        self.listener = Listener(self.token, self._on_hello, self._on_message, self._on_close,
                                 max_ranks=min(self._expected_world or 4096, 4096))
        host, port = self.listener.start()
        self._call("on_start", self)
        return f"{host}:{port}"

    def rank_env(self) -> dict[str, str]:
        """What the launcher adds to the ranks' environment (never to a command line or a file); plugins add theirs
        (job/divergence.py: --on-divergence)."""
        env = {TOKEN_ENV: self.token}
        for plugin in self.plugins:
            extra = getattr(plugin, "rank_env", None)
            if extra is not None:
                env.update(extra())
        return env

    def check(self, job: RunningJob) -> None:
        now = time.time()
        self.root_pid = job.proc.pid
        self._job = job
        self._call("on_tick", self, now)
        if self.hang is not None:
            if self._kill_at is not None and now >= self._kill_at:
                self._kill_at = None
                self._kill_all(job, signal.SIGKILL)
            return
        if now - self._activity_at >= ACTIVITY_EVERY_S:
            self._activity_at = now
            self._sample_activity(now)
        if self.decider is not None:  # the job spans nodes: the job layer judges every node's records
            self.decider(self, job, now)
            return
        self.decide_local(job, now)

    def decide_local(self, job: RunningJob, now: float, own_ranks_only: bool = False) -> None:
        """A job of one node: the same rule (job/rules.py) on this node's records. ``own_ranks_only``: a node of a
        larger job that lost its head judges its own ranks alone (the others' are not missing, only unseen)."""
        d = decide(self.records(now, job.started), self.limits(), now - job.started,
                   None if own_ranks_only else self.world_size)
        hung = self.gate.confirmed(d, self.limits(), now)
        if d.busy and not d.moving and not d.tearing_down:
            self._note_stalls(d.busy, now)
        elif hung:
            self._on_hang(job, d.stalled, now, own_ranks_only)
        else:
            self._check_teardown(job, now)

    def _check_teardown(self, job: RunningJob, now: float) -> None:
        """A rank whose script returned (its exit message, status 0) while its process is still alive a hang timeout
        later never exits: a non-daemon thread (or an atexit handler) keeps it, and with it torchrun and ddpdoctor,
        alive (docs/hangs.md#teardown). Cheap until a rank qualifies: the process tree is walked only then."""
        with self._lock:
            links = dict(self.links)
        done = {r: lk for r, lk in links.items() if lk.exit is not None and lk.exit.get("exit_code") == 0
                and not lk.exit.get("exception") and lk.exit_at is not None and now - lk.exit_at > TEARDOWN_SAMPLE_S
                and lk.pid and lk.pid not in self._lingering}
        if not done:
            return
        timeout = effective_timeout(self.records(now, job.started), self.limits())
        late = {}
        for r, lk in done.items():
            if not in_tree(lk.pid, self.root_pid):
                continue
            # Quiet, not busy: a rank still exporting its profile (or saving) in an atexit handler is working.
            sample = activity(lk.pid, only=frozenset({lk.main_tid})) if lk.main_tid else activity(lk.pid)  # type: ignore[arg-type]
            seen = self._quiet.get(r)
            if seen is None or seen[0] != sample:
                self._quiet[r] = (sample, now)
            elif now - max(seen[1], lk.exit_at or 0.0) > timeout:
                late[r] = lk
        if not late:
            return
        ranks = sorted(late)
        recs = self.records(now, job.started)
        stacks: dict[int, str | None] = {r: py_spy_dump(lk.pid) if lk.pid else None for r, lk in late.items()}
        verdict = build({0: NodeState(0, socket.gethostname(), recs, seq=0, received=now)}, self.world_size, ranks,
                        now, limits=self.limits(), timeout_s=timeout, on_hang=self.on_hang, stacks=stacks, dumps={},
                        since_start_s=now - job.started)
        ago = round(now - min(lk.exit_at or now for lk in late.values()))
        d = verdict.diagnosis
        d.kind, d.culprit_ranks, d.stalled_ranks, d.collective = "teardown", ranks, ranks, None
        d.reason = (f"rank(s) {ranks} finished (exit status 0, {ago} s ago) but their process never exited: a thread "
                    "that is not a daemon (or an atexit handler) keeps it alive; its stack shows which")
        verdict.detected_after_s = float(ago)
        verdict.heartbeats = {r: lk.beat for r, lk in links.items()}
        verdict.reported_after_s = round(ago + time.time() - now, 2)
        self.hang = verdict.to_json()
        self.declare(job, self.hang, f"hang detected ({d.reason}); report in {self.run_root}/hang.txt")
        self._lingering.update(lk.pid for lk in late.values() if lk.pid)
        if self.on_hang == "kill":  # declare() stopped the job; these ended their script, so stop them as well
            for lk in late.values():
                signal_own(lk.pid, self.root_pid, signal.SIGTERM)

    def limits(self) -> Limits:
        return Limits(self.hang_timeout, self.startup_timeout)

    def judge(self, now: float, job_started: float) -> StallDecision:
        """job/rules.decide on this node's records."""
        return decide(self.records(now, job_started), self.limits(), now - job_started, self.world_size)

    # -- the node's port to the job layer --------------------------------------------------------------
    def records(self, now: float, job_started: float, ended: bool = False) -> list[RankRecord]:
        """Every rank's typed record as of ``now`` (``ended``: this node's job is over, so a rank that never said
        how it ended died: a signal, an abort in C++)."""
        with self._lock:
            links = sorted(self.links.items())
        died: RankExitDoc = {"exit_code": None, "exception": "died without a status (killed by a signal, or aborted)"}
        return [record(r, lk.beat, lk.exit or (died if ended else None), now, job_started, lk.active_at,
                       lk.moved_at, lk.exit_at) for r, lk in links]

    def act(self, hang: HangDoc | RemoteVerdict, line: str, extra_text: str = "") -> None:
        """The job's verdict is a hang: declare it on this node (its files, its console, its ranks)."""
        if self.hang is None:
            self.declare(self._job, hang, line, extra_text)

    def end_now(self, ranks: list[int]) -> bool:
        """A plugin's word (job/divergence.py, --on-divergence stop) that ``ranks`` wait for peers that will never
        come: the hang is declared now, with every rank's stack and Flight Recorder dump, not at the hang timeout.
        One node only (a job of several: the job layer's head judges hangs); False when nothing was done."""
        job = self._job
        if job is None or self.hang is not None or self.decider is not None or not ranks:
            return False
        self._on_hang(job, ranks, time.time())
        return True

    def replay(self, rank: int, msg: RankMessage) -> None:
        """A message of a rank on another node (relayed by the job layer) to this node's plugins (its live watch)."""
        self._call("on_message", self, rank, msg)

    def say(self, line: str) -> None:
        say(line)

    def forward(self, raw: Mapping[str, object]) -> list[int]:
        """A capture request left on this node (live/watch.py: the client's request as it came, raw JSON), to the
        job's other nodes: the plugins' ``on_request`` (the job layer puts it in the job store) return the node
        ranks it went to."""
        req = capture_request(raw)
        out: list[int] = []
        for plugin in self.plugins:
            fn: Callable[..., Any] | None = getattr(plugin, "on_request", None)
            if fn is None:
                continue
            try:
                out += list(fn(self, req) or [])
            except Exception:  # noqa: BLE001 - a plugin never stops the watch
                self.plugin_errors += 1
        return out

    def deliver(self, req: CaptureRequest) -> None:
        """A capture request the head handed to this node through the job store, to this node's live watch."""
        self._call("on_job_request", self, req)

    def rank_ids(self) -> list[int]:
        with self._lock:
            return sorted(self.links)

    def collect_stacks(self) -> tuple[dict[int, str | None], dict[int, JsonValue]]:
        with self._lock:
            links = dict(self.links)
        return self.collect(links)

    def note_stalls(self, ranks: list[int], now: float) -> None:
        self._note_stalls([r for r in ranks if r in self.links], now)

    def stop(self, job: RunningJob) -> None:
        self._call("on_stop", self)
        if self.listener is not None:
            self.listener.close()
        if self.run_root is not None and self.writes_run_files:
            beats: dict[str, RankBeatsDoc] = {str(r): {"beat": lk.beat, "exit": lk.exit}
                                              for r, lk in sorted(self.links.items())}
            monitor: MonitorDoc = {"rejected": dict(self.listener.rejected) if self.listener else {},
                                   "plugin_errors": self.plugin_errors,
                                   "stalls": [s.to_json() for s in self.stalls.values()]}
            doc: HeartbeatsDoc = {"world_size": self.world_size, "ranks": beats, "monitor": monitor}
            try:
                write_json(self.run_root / "heartbeats.json", doc)
            except OSError:
                pass

    # -- plugin API ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[int, RankSnapshot]:
        """Every rank's state as plain data: beat (step, phase, collective, call site ...), exit, connection."""
        with self._lock:
            links = dict(self.links)
        return {r: {"rank": r, "beat": lk.beat, "exit": lk.exit, "last_seen": lk.last_seen, "active_at": lk.active_at,
                    "connected": bool(self.listener and self.listener.connected(r))} for r, lk in links.items()}

    def send(self, rank: int, msg: MonitorRequest) -> bool:
        """Send one request to ``rank`` (its heartbeat thread answers with a message of the same type)."""
        if self.listener is None:
            return False
        return self.listener.send(rank, json.dumps(msg, default=str).encode())

    def _call(self, hook: str, *args: Any) -> None:
        for plugin in self.plugins:
            fn: Callable[..., Any] | None = getattr(plugin, hook, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - a plugin never stops the watch
                self.plugin_errors += 1

    # -- detection -----------------------------------------------------------------------------------
    def effective_hang_timeout(self) -> float:
        from ddpdoctor.job.rules import effective_timeout

        return effective_timeout(self.records(time.time(), time.time()), self.limits())

    def stalled_ranks(self, now: float, job_started: float) -> list[int]:
        """Ranks still running whose step has not advanced within the timeout (start-up: --startup-timeout)."""
        return self.judge(now, job_started).stalled

    def busy_laggards(self, stalled: list[int], now: float) -> list[int]:
        """Stalled ranks outside any collective whose training thread is still doing something."""
        by_rank = {r.rank: r for r in self.records(now, now)}
        return [r for r in stalled if r in by_rank and is_busy(by_rank[r], STUCK_S)]

    def _just_moved(self, stalled: list[int], now: float) -> bool:
        """Under the default timeout, a stalled rank whose position changed less than STUCK_S ago is moving, not
        stuck (job/rules.py). A hang waits until every stalled rank stays put."""
        if self.hang_timeout is not None:
            return False
        by_rank = {r.rank: r for r in self.records(now, now)}
        return any(r in by_rank and just_moved(by_rank[r], STUCK_S) for r in stalled)

    def _sample_activity(self, now: float) -> None:
        with self._lock:
            links = [lk for lk in self.links.values() if lk.exit is None and lk.pid]
        for lk in links:
            if not in_tree(lk.pid, self.root_pid):
                continue
            # The training thread's own CPU and I/O: gloo's I/O threads, NCCL's watchdog and data-loader threads
            # keep spinning while it is blocked forever. Without its thread id (an older rank), every thread but
            # the heartbeat's.
            if lk.main_tid:
                sample = activity(lk.pid, only=frozenset({lk.main_tid}))  # type: ignore[arg-type]
                if sample is not None and waits_on_children(lk.pid, lk.main_tid):  # type: ignore[arg-type]
                    # Waiting for a child process that does the work (issue 40 item 2): the child's CPU and I/O are
                    # the rank's. gloo's spinning threads are still not counted: they are threads, not children.
                    kids = children_activity(lk.pid)  # type: ignore[arg-type]
                    sample = (sample[0] + kids[0], sample[1] + kids[1])
            else:
                skip = frozenset({lk.heartbeat_tid} if lk.heartbeat_tid else ())
                sample = activity(lk.pid, skip)  # type: ignore[arg-type]  # filtered on lk.pid above
            if sample is not None and sample != lk.activity:
                if lk.activity is not None:
                    lk.active_at = now
                lk.activity = sample

    def _note_stalls(self, ranks: list[int], now: float) -> None:
        for r in ranks:
            lk = self.links[r]
            beat: Beat = lk.beat or {}
            step = int(_num(beat.get("step")))
            key = (r, step)
            since = _num(beat.get("step_started"), now) if step else now
            if key not in self.stalls:
                self.stalls[key] = LongStall(r, step, beat.get("phase"), beat.get("where"), since)
                say(f"rank {r} has been busy outside any collective for {now - since:.0f} s (step {step}, at "
                    f"{beat.get('where')}); still working, not a hang: watching on")
                self.send(r, {"type": "dump"})
            self.stalls[key].stalled_s = round(now - since, 1)

    # -- messages (on the listener's thread) ----------------------------------------------------------
    def _on_hello(self, msg: RankMessage) -> tuple[int | None, str | None]:
        rank, world, pid = msg.get("rank"), msg.get("world_size"), msg.get("pid")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world, pid)):
            return None, "bad-hello"
        assert isinstance(rank, int) and isinstance(world, int) and isinstance(pid, int)
        expected = self._expected_world or self.world_size
        if not 0 < world <= MAX_WORLD or (expected is not None and world != expected):
            return None, "bad-world-size"
        if not 0 <= rank < world or pid <= 1:
            return None, "bad-rank"
        tid, main_tid = msg.get("tid"), msg.get("main_tid")
        with self._lock:
            self.world_size = world
            link = self.links.setdefault(rank, RankLink(rank))
            link.pid, link.last_seen = pid, time.time()
            link.heartbeat_tid = tid if isinstance(tid, int) else link.heartbeat_tid
            link.main_tid = main_tid if isinstance(main_tid, int) else link.main_tid
        return rank, None

    def _on_message(self, rank: int, msg: RankMessage) -> None:
        link = self.links[rank]
        link.last_seen = time.time()
        kind = msg.get("type")
        before = _place(link.beat)
        if kind == "beat":
            if link.beat is None or link.beat.get("where") != msg.get("where"):
                link.active_at = link.last_seen  # its Python position moved
            tid, main_tid = msg.get("tid"), msg.get("main_tid")
            if isinstance(tid, int):
                link.heartbeat_tid = tid
            if isinstance(main_tid, int):
                link.main_tid = main_tid
            link.beat = msg
        elif kind == "enter":
            before_enter: Beat = link.beat or {"rank": rank, "step": 0}
            link.beat = {**before_enter, "collective": msg.get("collective")}
        elif kind == "backward":  # entered backward() (DDP's bucket all-reduces), with its step: the beat's rest follows
            before_bw: Beat = link.beat or {"rank": rank}
            link.beat = {**before_bw, "step": msg.get("step", 0), "step_started": msg.get("step_started"),
                         "phase": "backward", "collective": None, "backward": msg.get("backward")}
        elif kind == "dump":
            link.dump = msg
            for stall in self.stalls.values():
                if stall.rank == rank and stall.stack is None and isinstance(msg.get("stacks"), str):
                    stall.stack = msg["stacks"]
        elif kind == "exit":
            status = msg.get("status")
            link.exit = status if isinstance(status, dict) else {}
            link.exit_at = link.last_seen
        if _place(link.beat) != before:
            link.moved_at = link.last_seen
            self.changes += 1
        elif kind == "exit":
            self.changes += 1
        self._call("on_message", self, rank, msg)

    def _on_close(self, rank: int) -> None:
        link = self.links.get(rank)
        if link is None or link.exit is not None:
            return
        # The connection closed without an exit message: the process died (signal, OOM killer).
        if self.root_pid is not None and not in_tree(link.pid, self.root_pid):
            link.exit = {"exit_code": None, "exception": "died without a status (signal or OOM killer?)"}

    # -- diagnosis -----------------------------------------------------------------------------------
    def _on_hang(self, job: RunningJob, stalled: list[int], now: float, own_ranks_only: bool = False) -> None:
        """A job of one node hung: the one verdict builder (job/verdict.build) on this node's typed records, as the
        head of many nodes builds it on every node's, plus this node's raw heartbeats."""
        with self._lock:
            links = dict(self.links)
        recs = self.records(now, job.started)
        node = NodeState(0, socket.gethostname(), recs, seq=0, received=now)
        stacks, dumps = self.collect(links)
        world = None if own_ranks_only else self.world_size  # a node that lost its head sees only its own ranks
        verdict = build({0: node}, world, [r for r in stalled if r >= 0], now, limits=self.limits(),
                        timeout_s=effective_timeout(recs, self.limits()), on_hang=self.on_hang, stacks=stacks,
                        dumps=dumps, since_start_s=now - job.started)
        verdict.heartbeats = {r: lk.beat for r, lk in links.items()}
        # Detection plus collecting stacks and dumps: what the "within hang-timeout + 5 s" bounds.
        verdict.reported_after_s = round(verdict.detected_after_s + time.time() - now, 2)
        self.hang = verdict.to_json()
        alone = "on this node's own ranks (the job's head is lost) " if own_ranks_only else ""
        self.declare(job, self.hang, f"hang detected {alone}({verdict.diagnosis.reason}); report in "
                     f"{self.run_root}/hang.txt")

    def declare(self, job: RunningJob | None, hang: HangDoc | RemoteVerdict, line: str, extra_text: str = "") -> None:
        """The job hung: write RUN/hang.json and hang.txt (``extra_text`` after the summary), say ``line``, and
        stop the job unless --on-hang report. The job layer calls it with the head's verdict on every node."""
        self.hang = hang
        # Only the node that judged writes the verdict (a node acting on the head's word writes none).
        if self.run_root is not None and self.writes_run_files and "diagnosis" in hang:
            try:
                write_json(self.run_root / "hang.json", hang)
                write_private_text(self.run_root / "hang.txt", hang_text(hang, extra_text))
            except OSError as exc:  # a full disk (DiskFull): the verdict is still said and acted on
                reserve = getattr(job, "reserve", None)
                if reserve is not None:
                    reserve.note(getattr(exc, "path", None) or self.run_root / "hang.json", exc)
        say(line)
        if self.on_hang == "kill" and job is not None:
            self._kill_all(job, signal.SIGTERM)
            self._kill_at = time.time() + KILL_GRACE_S

    def collect(self, links: dict[int, RankLink]) -> tuple[dict[int, str | None], dict[int, JsonValue]]:
        """Every live rank's stack (py-spy, else its heartbeat dump, else faulthandler) and Flight Recorder dump."""
        live = {r: lk for r, lk in links.items() if lk.exit is None}
        asked = set()
        for r, lk in live.items():
            lk.dump = None
            if self.send(r, {"type": "dump"}):
                asked.add(r)
        own = {r: lk.pid for r, lk in live.items() if in_tree(lk.pid, self.root_pid)}
        spy: dict[int, str | None] = {}  # None: py-spy missing or could not attach
        threads = [threading.Thread(target=lambda r=r, pid=pid: spy.__setitem__(r, py_spy_dump(pid)))
                   for r, pid in own.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        deadline = time.time() + 5
        while time.time() < deadline and any(live[r].dump is None for r in asked):
            time.sleep(0.05)
        stacks: dict[int, str | None] = {}  # None: every way failed; hang_text says so
        dumps: dict[int, JsonValue] = {}
        for r, lk in live.items():
            dump: RankMessage = lk.dump or {}
            dumps[r] = dump.get("flight_recorder")
            got = dump.get("stacks")
            text = got if isinstance(got, str) else None
            if not (spy.get(r) or text) and self.run_dir is not None:
                text = faulthandler_dump(own.get(r), self.root_pid, self.run_dir.rank_file(r, "stacks.txt"))
            stacks[r] = spy.get(r) or text
        return stacks, dumps

    def _kill_all(self, job: RunningJob, sig: int) -> None:
        job.kill("hang", sig)
        for lk in self.links.values():
            if lk.exit is None or lk.pid in self._lingering:
                signal_own(lk.pid, self.root_pid, sig)


def say(line: str) -> None:
    """One line of the watch on ddpdoctor's stderr (rendering and click live in commands/ and renderers/)."""
    print(f"ddpdoctor: {line}", file=sys.stderr, flush=True)


def _place(beat: Beat | None) -> tuple[int | None, str | None, str, str]:
    """Where a rank is, as far as hangs go: its step, phase, collective and backward() entry."""
    b: Beat = beat or {}
    coll, bw = b.get("collective"), b.get("backward")
    return (b.get("step"), b.get("phase"), repr(coll.get("since") if isinstance(coll, dict) else coll),
            repr(bw.get("since") if isinstance(bw, dict) else bw))


def _num(value: object, default: float = 0.0) -> float:
    """A number from a rank's message, or ``default`` for anything else (a message never crashes the monitor)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def hang_text(hang: HangDoc, classes: str = "") -> str:
    """RUN/hang.txt: what hung, the culprit, each rank's position and stack (``classes``: the job layer's ranks
    grouped by state and stack, shown instead of one line and one stack per rank)."""
    d = hang["diagnosis"]
    lines = [
        f"HANG detected after {hang['detected_after_s']} s without progress (hang timeout {hang['hang_timeout_s']} s)",
        f"diagnosis: {d['kind']}: {d['reason']}",
        f"culprit rank(s): {d['culprit_ranks'] or 'undetermined'}; stalled rank(s): {d['stalled_ranks']}",
        "",
    ]
    if classes:
        from ddpdoctor.job.grouping import rank_ranges

        lines[2] = (f"culprit rank(s): {rank_ranges(d['culprit_ranks']) if d['culprit_ranks'] else 'undetermined'}; "
                    f"stalled rank(s): {rank_ranges(d['stalled_ranks'])}")
        return "\n".join(lines) + "\n" + classes
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

"""One node's part in watching the whole job: publish this node's ranks' records through the job store; on the head,
read every node's records and decide with the one stall rule (job/rules.py: busy is not hung, just moved) and the
job-wide rules of job/state.py (culprit, lost node, crash root); at the end, gather the ranks' files and hand every
node the head's one verdict.

The agent sees its node only through a NodePort (the node's monitor implements it: its ranks' typed records, their
stacks, acting on a verdict); the monitor calls decide() from the launcher's poll loop and finish() once the job
ended; everything else runs on one publishing thread."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ddpdoctor.job import grouping, state
from ddpdoctor.job.capture_relay import CaptureRequest, HeadCaptures, NodeCaptures
from ddpdoctor.job.divergence_relay import HEAD_BELL, WORD, DivergenceRelay, word_bell
from ddpdoctor.job.record import LongStall, RankRecord
from ddpdoctor.job.relay import HeadRelay, NodeRelay
from ddpdoctor.job.role import JobRole, NodeInfo
from ddpdoctor.job.rules import HangGate, Limits, StallDecision, auto_hang_timeout, decide
from ddpdoctor.job.store import JobStore, JobStoreError, job_port, shared_token
from ddpdoctor.job.verdict import HeadLost, HeadWord, RemoteVerdict, build, rank_line
from ddpdoctor.jsontypes import JsonObject, JsonValue
from ddpdoctor.rundir.records import HangDoc, RankMessage
from ddpdoctor.safe_io import write_atomic


class NodePort(Protocol):
    """What the job layer needs of a node's monitor (launch/monitor.HangMonitor implements it)."""

    hang_timeout: float | None
    startup_timeout: float
    on_hang: str
    world_size: int | None
    stalls: dict[tuple[int, int], LongStall]
    changes: int  # moves on every change of a rank's place (step, phase, collective) or exit: publish at once

    def records(self, now: float, job_started: float, ended: bool = False) -> list[RankRecord]: ...

    def rank_ids(self) -> list[int]: ...

    def collect_stacks(self) -> tuple[dict[int, str | None], dict[int, JsonValue]]: ...

    def note_stalls(self, ranks: list[int], now: float) -> None: ...

    def act(self, hang: HangDoc | RemoteVerdict, line: str, extra_text: str = "") -> None: ...

    def replay(self, rank: int, msg: RankMessage) -> None: ...

    def say(self, line: str) -> None: ...

    def deliver(self, req: CaptureRequest) -> None: ...

    def decide_local(self, job: Any, now: float, own_ranks_only: bool = False) -> None: ...

PUBLISH_S = 1.0  # a beat about once a second, at once on a change that matters
TICK_S = 0.1
POLL_S = 0.5
STACKS_WAIT_S = 12.0  # for the other nodes' stacks after a hang (py-spy may take seconds per rank)
READ_EVERY_S = 0.5  # the head reads every node's state this often (each read parses the whole job's records)
END_WAIT_S = 60.0
HEAD_SILENT_S = 20.0  # no answer from the head's store this long: this node watches its own ranks alone
REPORT_WAIT_S = 20.0  # the head waits this long for every node to take the job's report  # the head waits this long for every node to finish; the others for the head's verdict
RANK_FILES = ("status.json", "info.json", "summary.json")
STDERR_TAIL = 16 << 10


@dataclass
class Outcome:
    """How this node ends: the job's exit code, whether this node reports, and the line the others print."""

    code: int
    reports: bool
    line: str | None = None


class JobAgent:
    def __init__(self, role: JobRole, monitor: NodePort, run_root: Path) -> None:
        self.role, self.monitor, self.run_root = role, monitor, run_root
        self.host = socket.gethostname()
        self.store: JobStore | None = None
        self.nodes: dict[int, state.NodeState] = {n: state.NodeState(n) for n in range(role.nnodes)}
        self.verdict: HeadWord | None = None  # the head's hang verdict, once declared
        self.seq = 0
        self.end: int | None = None
        self._stop = threading.Event()
        self._answered: set[int] = set()
        self._busy_said: set[int] = set()
        self._peers: list[int] = []
        self._head_host: str | None = self.host if role.is_head else None
        self._head_lost = False
        # A node's record found gone or refused after the head had read it: only another client of the store does
        # that (no node deletes, the head never deletes a node's record). node -> (times, when last seen so).
        self._interfered: dict[int, tuple[int, float]] = {}
        self._interference_said: set[int] = set()
        self.head_lost: HeadLost | None = None  # what this node knows once the head is gone (commands print it)
        self._contact = 0.0  # when the head's store last answered this node
        self._relay, self._head_relay = NodeRelay(), HeadRelay()  # live health job-wide (job/relay.py)
        self._relay_lock = threading.Lock()
        # The ranks' per-step fingerprints job-wide (job/divergence_relay.py): the nodes relay, the head judges.
        self.fingerprints = DivergenceRelay(role.node_rank, role.is_head)
        # `ddpdoctor capture` job-wide (job/capture_relay.py): the head forwards, the nodes send their windows back.
        self._node_caps = NodeCaptures(role.node_rank, run_root)
        self._head_caps = HeadCaptures(run_root) if role.is_head else None
        self._thread: threading.Thread | None = None
        self._job_started = time.time()
        self._read_at = 0.0
        self.gate = HangGate()  # a hang holds on a second, newer view before it is declared
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
        if self.fingerprints.stop_mode:
            # --on-divergence stop holds every optimizer step for the head's word: records and word travel at
            # once, each side woken by a bell (a blocking pop on the job store) instead of the next of three polls.
            if self.is_head:
                self.fingerprints.on_word = self._word_now
            threading.Thread(target=self._bells, name="ddpdoctor-fp-bells", daemon=True).start()

    def _bells(self) -> None:
        """Stop mode: the head takes the nodes' records the moment one rings (its judge's word then goes out at
        once: _word_now); a node hands the head's word to its ranks the moment the head rings it."""
        while self.store is None and not self._stop.is_set():
            self._stop.wait(TICK_S)  # a node's store is connected by its agent's loop
        store = self.store
        if store is None:
            return
        me = self.role.node_rank
        try:
            bell = store.bell(HEAD_BELL if self.is_head else word_bell(me))
        except (RuntimeError, OSError, ValueError):
            return  # the ticks carry on alone
        while bell.wait() and not self._stop.is_set():
            try:
                if self.is_head:
                    self.fingerprints.take(store, list(self.nodes), self.monitor)
                else:  # with the head's acknowledgement: records go out every step, it keeps the backlog short
                    got = store.get_many([WORD, f"fp-ack/{me}"])
                    self.fingerprints.acked(got.get(f"fp-ack/{me}"))
                    self.fingerprints.deliver(got.get(WORD), self.monitor)
            except (RuntimeError, OSError, ValueError):
                pass

    def _word_now(self) -> None:
        """The head's judge has a new word (stop mode): put it and ring every other node's bell now."""
        store = self.store
        if store is None:
            return
        try:
            if self.fingerprints.put_word(store):
                for n in self.nodes:
                    if n != self.role.node_rank:
                        store.ring(word_bell(n))
        except (RuntimeError, OSError, ValueError):
            pass  # the tick puts it again

    # -- every node: publish -------------------------------------------------------------------------
    def _records(self) -> list[RankRecord]:
        # Once this node's job ended, a rank that never said how it ended died (a signal, an abort in C++).
        return self.monitor.records(time.time(), self._job_started, ended=self.end is not None)

    def _signature(self) -> int:
        return self.monitor.changes

    def publish(self) -> None:
        if self.store is None:
            return
        self.seq += 1
        env = state.envelope(self.role.node_rank, self.host, self.seq, self._records(), self.end)
        self.store.put(f"node/{self.role.node_rank}", env)
        if not self.is_head:
            with self._relay_lock:
                live = self._relay.payload(self.seq)
            if live is not None:
                self.store.put(f"live/{self.role.node_rank}", live)
            self.fingerprints.publish(self.store, force=True)  # again what the head has not acknowledged

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
                self._fingerprints_tick()
                if now >= next_poll:
                    # The head's requests (stacks after a hang, captures) and verdict: twice a second, a few small
                    # requests; the head takes the windows the nodes sent back.
                    if self.is_head:
                        self._take_captures()
                        if self.verdict is not None:  # again: another client of the store may have removed it
                            self.store.put("verdict", self.verdict.to_json())  # type: ignore[union-attr]
                    else:
                        self._poll_head()
                        self._contact = time.time()
                        self._send_captures()
                    next_poll = now + POLL_S
            except (RuntimeError, OSError, ValueError):
                pass  # the head went away or is restarting: keep the ranks watched locally, try again
            self._stop.wait(TICK_S)

    def _fingerprints_tick(self) -> None:
        """Every tick (0.1 s): a node puts its ranks' new records; in stop mode it reads the head's word (its ranks
        hold their optimizer step for it); the head puts its word."""
        if self.store is None:
            return
        fp = self.fingerprints
        if self.is_head:
            fp.put_word(self.store)
            return
        fp.publish(self.store)
        if fp.stop_mode:
            fp.deliver(self.store.get(WORD), self.monitor)

    def _poll_head(self) -> None:
        assert self.store is not None
        me = self.role.node_rank
        got = self.store.get_many(["req", "verdict", "busy", "capture", f"live-ack/{me}", f"fp-ack/{me}", WORD])
        self.fingerprints.acked(got.get(f"fp-ack/{me}"))
        self.fingerprints.deliver(got.get(WORD), self.monitor)
        for creq in self._node_caps.new_requests(got.get("capture")):
            self.monitor.deliver(creq)
        with self._relay_lock:
            self._relay.acked(got.get(f"live-ack/{self.role.node_rank}"))
        busy = got.get("busy")
        if isinstance(busy, dict) and isinstance(busy.get("ranks"), list):
            # The head's long stalls, as (rank, step): this node notes its own ranks still in that step.
            now_steps = {r.rank: r.step for r in self._records()}
            self.monitor.note_stalls([p[0] for p in busy["ranks"] if isinstance(p, list) and len(p) == 2
                                      and p[0] in now_steps and now_steps[p[0]] == p[1]], time.time())
        req = got.get("req")
        if isinstance(req, dict) and isinstance(req.get("id"), int) and req["id"] not in self._answered:
            self._answered.add(req["id"])
            stacks, _ = self.monitor.collect_stacks()
            self.store.put(f"stacks/{self.role.node_rank}", {str(r): _tail(s) for r, s in stacks.items()})
        if self.verdict is None:
            self.verdict = HeadWord.from_json(got.get("verdict"))

    def _send_captures(self) -> None:
        """This node's parts of the capture windows the head asked for (job/capture_relay.py)."""
        assert self.store is not None
        for name, value in self._node_caps.outgoing():
            self.store.put(name, value)

    def _take_captures(self) -> None:
        """The head: write the other nodes' window parts into its own window folders, then drop them from the store."""
        if self.store is None or self._head_caps is None:
            return
        names = self._head_caps.names()
        if names:
            self.store.delete(self._head_caps.take(self.store.get_many(names)))

    def on_request(self, monitor: Any, req: CaptureRequest) -> list[int]:
        """HangMonitor.forward: a capture request left on the head goes to every other live node through the store;
        the node ranks it went to. Another node forwards nothing (capture the head's run directory)."""
        if not self.is_head or self.store is None or self._head_caps is None:
            return []
        nodes = [n for n, st in self.nodes.items() if n != self.role.node_rank and not st.lost and st.end is None]
        if not nodes:
            return []
        self.store.put("capture", self._head_caps.forward(req, nodes))
        return nodes

    # -- the monitor's hooks ---------------------------------------------------------------------------
    def on_start(self, monitor: Any) -> None:
        self.start(time.time())

    def on_message(self, monitor: Any, rank: int, msg: RankMessage) -> None:
        """A node relays its ranks' iteration records to the head (whose live watch judges the whole job); the
        node's own live watch (after this plugin) then sees none of them."""
        if not self.is_head and msg.get("type") == "beat":
            with self._relay_lock:
                self._relay.add(rank, msg.pop("steps", None), msg.get("phase"))
        elif not self.is_head and msg.get("type") == "fp":
            self.fingerprints.add(rank, msg.get("fp"))
            store = self.store
            if self.fingerprints.stop_mode and store is not None:
                try:  # a held optimizer step waits for this: put now and wake the head, not on the next tick
                    self.fingerprints.publish(store)
                    store.ring(HEAD_BELL)
                except (RuntimeError, OSError, ValueError):
                    pass  # the tick publishes it again

    def decide(self, monitor: Any, job: Any, now: float) -> None:
        """HangMonitor.decider: the head decides for the job; another node acts on the head's verdict."""
        if self.is_head:
            self._decide(job.started)
        elif self.verdict is not None:
            remote: RemoteVerdict = {"remote": True, **self.verdict.to_json()}
            self.monitor.act(remote, self.verdict.line)
        elif self._contact and now - self._contact > HEAD_SILENT_S:
            # The head is silent (its host or launcher died): nobody judges for the job, so this node judges its
            # own ranks with the same rule, as a job of one node would (ranks of other nodes are not counted).
            self.monitor.decide_local(job, now, own_ranks_only=True)

    def read_nodes(self) -> None:
        """Refresh every node's state from the store (the head's view of the job)."""
        if self.store is None:
            return
        now = time.time()
        refused = dict(self.store.refused)
        got = self.store.get_many([f"node/{n}" for n in self.nodes])
        for n, st in self.nodes.items():
            name = f"node/{n}"
            env = got.get(name)
            if isinstance(env, dict) and env.get("v") == state.VERSION:
                st.update(env, now)
            elif self.store.refused.get(name, 0) > refused.get(name, 0) or (st.seq >= 0 and name not in got):
                times, _ = self._interfered.get(n, (0, 0.0))
                self._interfered[n] = (times + 1, now)

    def unknown_nodes(self) -> list[int]:
        """Nodes silent since another client of the job store deleted or damaged their record: their state is
        unknown, not lost (the node may be training on), so they are neither judged lost nor hung."""
        return sorted(n for n, (_, at) in self._interfered.items()
                      if at > self.nodes[n].received and self.nodes[n].end is None)

    def _interference(self, n: int) -> str:
        st = self.nodes[n]
        return (f"node {n} ({st.host}): its record in the job store was deleted or damaged {self._interfered[n][0]} "
                f"time(s) by another client of the job store ({self.role.master_addr}:{self._port})")

    def _say_interference(self, nodes: list[int]) -> None:
        for n in nodes:
            if n not in self._interference_said:
                self._interference_said.add(n)
                self.monitor.say(f"{self._interference(n)}: its state is unknown, so it is judged neither lost "
                                 "nor hung while its record is missing; keep the job store's port reachable by the "
                                 "job's hosts only (docs/trust.md)")

    def hang_timeout(self) -> float:
        t = self.monitor.hang_timeout
        return t if t is not None else auto_hang_timeout(state.slowest_step(self.nodes))

    def _world_size(self) -> int | None:
        sizes = [self.monitor.world_size] if self.monitor.world_size else []
        return max(sizes) if sizes else None

    def _take_live(self) -> None:
        """The head: the other nodes' relayed iteration records into this node's plugins (its live watch), once."""
        assert self.store is not None
        others = [n for n in self.nodes if n != self.role.node_rank]
        got = self.store.get_many([f"live/{n}" for n in others])
        for name, payload in got.items():
            node = int(name.split("/")[1])
            before = self._head_relay.taken.get(node, 0)
            for rank, steps, phase in self._head_relay.take(node, payload):
                self.monitor.replay(rank, {"type": "beat", "steps": steps, "phase": phase})
            if self._head_relay.taken.get(node, 0) != before:
                self.store.put(f"live-ack/{node}", self._head_relay.taken[node])

    def judge(self, now: float, job_started: float) -> StallDecision:
        """The one stall rule (job/rules.py) on every node's records, as on one node. A record's step age grows by
        how long ago its envelope arrived; its training thread's idle time and last move are as its node measured
        them when it published (a node that stops publishing is a lost node, not a busy one)."""
        unknown = set(self.unknown_nodes())
        recs, extra = state.live_records({n: st for n, st in self.nodes.items() if n not in unknown}, now)
        return decide(recs, Limits(self.monitor.hang_timeout, self.monitor.startup_timeout), now - job_started,
                      None, extra)

    def _decide(self, job_started: float) -> None:
        if self.store is not None and (self.fingerprints.stop_mode or time.time() - self._read_at >= READ_EVERY_S):
            try:  # in stop mode every poll (0.1 s): the ranks hold their optimizer step for the judge's word
                self.fingerprints.take(self.store, list(self.nodes), self.monitor)
            except (RuntimeError, OSError, ValueError):
                pass
        if time.time() - self._read_at < READ_EVERY_S:
            return
        self._read_at = time.time()
        try:
            self.read_nodes()
            self._take_live()
        except (RuntimeError, OSError, ValueError):
            return
        now = time.time()
        timeout = self.hang_timeout()
        unknown = self.unknown_nodes()
        self._say_interference(unknown)
        for n in state.lost_nodes(self.nodes, now, after_s=timeout):
            if n not in unknown:
                self.nodes[n].lost = True
        lost = [n for n, st in self.nodes.items() if st.lost]
        never = [n for n, st in self.nodes.items() if st.seq < 0]
        if never and now - job_started > self.monitor.startup_timeout:
            for n in never:
                self.nodes[n].lost = True
            lost += never
        d = self.judge(now, job_started)
        view_at = min((st.received for n, st in self.nodes.items() if not st.lost and st.end is None
                       and n not in unknown), default=now)
        hung = self.gate.confirmed(d, Limits(self.monitor.hang_timeout, self.monitor.startup_timeout), now, view_at)
        if lost:
            self._on_hang(d.stalled, now, d.timeout_s, job_started)
        elif d.busy and not d.moving and not d.tearing_down:
            self._note_busy(d.busy, now)
        elif hung:
            self._on_hang(d.stalled, now, d.timeout_s, job_started)

    def _note_busy(self, ranks: list[int], now: float) -> None:
        """A long stall, not a hang: each node notes its own busy ranks (with their stacks); the head says so once."""
        mine = set(self.monitor.rank_ids())
        self.monitor.note_stalls([r for r in ranks if r in mine], now)
        new = [r for r in ranks if r not in mine and r not in self._busy_said]
        if new:
            self._busy_said.update(new)
            self.monitor.say(f"rank(s) {grouping.rank_ranges(new)} on another node are busy outside any collective "
                             "past the hang timeout; still working, not a hang: watching on")
        if self.store is not None:
            steps = {r.rank: r.step for st in self.nodes.values() for r in st.ranks if r.rank in ranks}
            try:
                self.store.put("busy", {"ranks": [[r, steps.get(r)] for r in sorted(ranks)]})
            except (RuntimeError, OSError):
                pass

    def _on_hang(self, stalled: list[int], now: float, timeout: float, job_started: float) -> None:
        assert self.store is not None
        pos, node_of = state.positions(self.nodes, self._world_size())
        live = [n for n, st in self.nodes.items() if not st.lost and st.end is None and n != self.role.node_rank]
        self.store.put("req", {"id": 1, "what": "stacks"})
        stacks, dumps = self.monitor.collect_stacks()
        deadline = time.time() + STACKS_WAIT_S
        remote: dict[str, object] = {}  # each node's stacks as read off the store (raw JSON in: checked below)
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
        hang = build(self.nodes, self._world_size(), stalled, now, timeout_s=timeout, on_hang=self.monitor.on_hang,
                     limits=Limits(self.monitor.hang_timeout, self.monitor.startup_timeout), stacks=all_stacks,
                     dumps=dumps, since_start_s=now - job_started, where=(pos, node_of))
        d = hang.diagnosis
        hang.classes = [c.to_json() for c in classes]
        hang.nodes = {n: {"host": st.host, "lost": st.lost, "ranks": grouping.rank_ranges(r.rank for r in st.ranks)}
                      for n, st in self.nodes.items()}
        line = f"job hung: {d.reason}"
        if d.culprit_ranks:
            line = f"job hung: culprit rank(s) {grouping.rank_ranges(d.culprit_ranks)}: {d.reason}"
        hang.reported_after_s = round(hang.detected_after_s + time.time() - now, 2)
        self.verdict = HeadWord(line, 1, self.host, str(self.run_root / "hang.txt"), self.monitor.on_hang)
        self.store.put("verdict", self.verdict.to_json())
        self.monitor.act(hang.to_json(), f"{line}; report in {self.run_root}/hang.txt", extra_text=grouping.render(classes))

    # -- the end ---------------------------------------------------------------------------------------
    def finish(self, run_root: Path, code: int) -> Outcome:
        """This node's job ended with ``code``: publish it with the ranks' files; the head waits for every node,
        writes the files it lacks (no shared filesystem) and tells every node the job's verdict."""
        self.end = code
        self._stop.set()
        if self.fingerprints.stop_mode and self.store is not None:
            with contextlib.suppress(RuntimeError, OSError, ValueError):  # wake this node's bell waiter to end
                self.store.ring(HEAD_BELL if self.is_head else word_bell(self.role.node_rank))
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
            self.store.put(f"stalls/{self.role.node_rank}", [s.to_json() for s in self.monitor.stalls.values()])
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
        for r in self.monitor.rank_ids():
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
        answered = True
        put_at = time.time() + 1.0
        while time.time() < deadline:
            try:
                final = HeadWord.from_json(self.store.get("final"))
                if final is None and self.end is not None and time.time() >= put_at:
                    # Again about once a second: another client of the store may have deleted this node's end,
                    # and the head, never seeing it, would wait and call this node's end unknown.
                    self.publish()
                    put_at = time.time() + 1.0
            except (RuntimeError, OSError):
                answered = False
                break  # the head is gone
            if final is not None:
                try:
                    self.store.put(f"ack/{self.role.node_rank}", 1)
                except (RuntimeError, OSError):
                    pass
                self._head_host = final.head
                return Outcome(final.code, False, f"{final.line}; the job's report is on the head node "
                               f"({final.head}) in {final.report}")
            time.sleep(0.3)
        if answered:
            return self._word_missing(code)
        self._head_lost = True
        self.head_lost = self._lost_head(code)
        return Outcome(self.head_lost.exit_code, False, self.head_lost.line)

    def _word_missing(self, code: int) -> Outcome:
        """The head's store answered to the end but its final word never came (removed or damaged by another client
        of the store): the job's exit code from every node's own sealed record when each says how it ended, else
        1 (the job's end is unknown), with the line saying so. Never 'the head was lost': it was not."""
        assert self.store is not None
        why = self.store.tampered() or "; it was removed from the job store (another client of the store?)"
        try:
            self.read_nodes()
        except (RuntimeError, OSError):
            pass
        ends = [st.end for st in self.nodes.values()]
        if all(e is not None for e in ends):
            job_code = 1 if any(ends) else 0
            return Outcome(job_code, False, f"the head's final word did not arrive{why}; every node's own record "
                           f"says the job ended with exit code {job_code} (this node: {code})")
        return Outcome(1, False, f"the head's final word did not arrive{why}; the job's end is unknown: this node "
                       f"({self.host}, node {self.role.node_rank}) ended with exit code {code}, node(s) "
                       f"{grouping.rank_ranges(n for n, e in zip(self.nodes, ends, strict=True) if e is None)} "
                       f"said nothing; the report is on the head node ({self.role.master_addr})")

    def _lost_head(self, code: int) -> HeadLost:
        """The one line (and the document) of a node whose head is gone: its own ranks' last state and the last
        verdict the head handed out. Exit code 1 whatever this node's ranks did: a node of the job died."""
        recs = self._records()
        shown = "; ".join(rank_line(r) for r in recs[:4]) + (f"; {len(recs) - 4} more rank(s) (--json for all)"
                                                              if len(recs) > 4 else "")
        last = self.verdict.line if self.verdict is not None else None
        line = (f"the head node ({self.role.master_addr}) was lost: it did not answer; this node ({self.host}, node "
                f"{self.role.node_rank}) ended with exit code {code}; its ranks: {shown or 'none started'}; last "
                f"verdict from the head: {last or 'none'}")
        return HeadLost(self.role.master_addr, line, self.role.node_rank, recs, last)

    def _finish_head(self, run_root: Path, code: int) -> Outcome:
        assert self.store is not None
        deadline = time.time() + END_WAIT_S
        while time.time() < deadline:
            try:
                self.read_nodes()
            except (RuntimeError, OSError):
                break
            now = time.time()
            unknown = self.unknown_nodes()
            for n in state.lost_nodes(self.nodes, now, after_s=min(15.0, self.hang_timeout())):
                if n not in unknown:
                    self.nodes[n].lost = True
            if all(st.end is not None or st.lost for st in self.nodes.values()):
                break
            time.sleep(0.3)
        others = [n for n in self.nodes if n != self.role.node_rank]
        files = self.store.get_many([f"files/{n}" for n in others])
        write_missing(run_root, files)
        merge_stalls(run_root, self.store.get_many([f"stalls/{n}" for n in others]))
        codes = [st.end for st in self.nodes.values() if st.end is not None]
        unknown = self.unknown_nodes()
        lost = [n for n, st in self.nodes.items() if (st.lost or st.end is None) and n not in unknown]
        # A node whose end never arrived because its record was deleted or damaged: the job's end is unknown (1),
        # said as such, never "its host died".
        job_code = code or next((c for c in codes if c), 0) or (1 if lost or unknown else 0)
        said = "; ".join(f"{self._interference(n)}: its end is unknown" for n in unknown)
        if unknown and not lost and not code and not any(codes) and self.verdict is None:
            line = f"the job's end is unknown: {said}; every other node ended with exit code 0"
        else:
            line = self._summary(job_code, lost) + (f"; {said}" if unknown else "")
        # The head's command saves the job's report as RUN/report.json (rundir/report.py; run, profile, check-sync):
        # the other nodes point to it. No report.txt is written (the console's report is not saved as text).
        word = HeadWord(line, 1 if job_code else 0, self.host, str(run_root / "report.json")).to_json()
        self.store.put("final", word)
        self._peers = [n for n in self.nodes if n != self.role.node_rank and n not in lost]
        self._wait_acks("ack", 15.0, ("final", word))
        if self.verdict is None:  # a hang verdict was said when it was declared
            self.monitor.say(line)
        return Outcome(job_code, True, line)

    def _wait_acks(self, kind: str, wait_s: float, again: tuple[str, Any] | None = None) -> None:
        """Until every live node acknowledged ``kind`` (the job store lives as long as this process), putting
        ``again`` (name, value) back about once a second: another client of the store may delete it."""
        assert self.store is not None
        waiting = list(self._peers)
        deadline = time.time() + wait_s
        put_at = time.time() + 1.0
        while waiting and time.time() < deadline:
            try:
                got = self.store.get_many([f"{kind}/{n}" for n in waiting])
                if again is not None and time.time() >= put_at:
                    self.store.put(*again)
                    put_at = time.time() + 1.0
            except (RuntimeError, OSError):
                return
            waiting = [n for n in waiting if f"{kind}/{n}" not in got]
            time.sleep(0.2)

    # -- the job's report on every node ------------------------------------------------------------------
    def node_info(self) -> NodeInfo:
        """Which node this is, for the report every node prints."""
        return NodeInfo(self.role.node_rank, self.role.nnodes, self.host, self.is_head, self._head_host)

    def publish_report(self, doc: JsonObject) -> None:
        """The head: hand the job's report (report.json's document) to every node, and wait until each has it."""
        if self.store is None or not self.is_head:
            return
        try:
            self.store.put("report", doc)
        except (RuntimeError, OSError, ValueError):
            return
        self._wait_acks("report-ack", REPORT_WAIT_S, ("report", doc))

    def job_report(self) -> JsonObject | None:
        """Another node: the head's report of the whole job (Report.to_json() as the head published it, loaded typed
        again by the caller); None when the head is lost (it did not answer)."""
        if self.store is None or self.is_head or self._head_lost:
            return None
        deadline = time.time() + END_WAIT_S
        while time.time() < deadline:
            try:
                doc = self.store.get("report")
            except (RuntimeError, OSError):
                return None
            if isinstance(doc, dict):
                try:
                    self.store.put(f"report-ack/{self.role.node_rank}", 1)
                except (RuntimeError, OSError):
                    pass
                return doc
            time.sleep(0.3)
        return None

    def _summary(self, code: int, lost: list[int]) -> str:
        """The job's one line: the head's hang verdict, else a lost node, else the crash's root cause."""
        if self.verdict is not None:
            return self.verdict.line
        from ddpdoctor.findings.crash import is_victim

        st = state.statuses(self.nodes)
        roots = [r for r in state.crash_root(self.nodes)
                 if not (lost and is_victim(str((st.get(r) or {}).get("exception"))))]
        if lost:
            hosts = ", ".join(f"node {n} ({self.nodes[n].host})" for n in lost)
            ranks = grouping.rank_ranges(r.rank for n in lost for r in self.nodes[n].ranks)
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


def write_missing(run_root: Path, files: Mapping[str, object]) -> None:
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
                if not os.path.lexists(path):
                    rdir.mkdir(mode=0o700, parents=True, exist_ok=True)
                    with contextlib.suppress(OSError):
                        write_atomic(path, text)


def merge_stalls(run_root: Path, remote: Mapping[str, object]) -> None:
    """Add the other nodes' long stalls (their busy ranks, with stacks) to RUN/heartbeats.json's, which the head's
    monitor wrote with its own: the report's long-stall findings are the job's."""
    from ddpdoctor.rundir.layout import write_json

    extra = [s for per in remote.values() if isinstance(per, list) for s in per
             if isinstance(s, dict) and isinstance(s.get("rank"), int)]
    if not extra:
        return
    path = run_root / "heartbeats.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    monitor = doc.setdefault("monitor", {})
    if not isinstance(monitor, dict):
        monitor = doc["monitor"] = {}
    got = monitor.get("stalls")
    stalls: list[Any] = got if isinstance(got, list) else []
    seen = {(s.get("rank"), s.get("step")) for s in stalls if isinstance(s, dict)}
    stalls.extend(s for s in extra if (s["rank"], s.get("step")) not in seen)
    monitor["stalls"] = stalls
    try:
        write_json(path, doc)
    except OSError:
        pass


def attach_agent(role: JobRole, watcher: Any, run_root: Path) -> JobAgent | None:
    """Hook the job layer into this node's monitor (its plugins and decider); None without a monitor (an object
    with the NodePort's methods). A job store that cannot be hosted or a foreign token file is bad input (one
    line, exit 2)."""
    from ddpdoctor.errors import BadInput

    watcher = getattr(watcher, "inner", watcher)  # the progress display wraps the monitor on a terminal
    if not all(hasattr(watcher, name) for name in ("records", "collect_stacks", "act", "replay", "plugins")):
        return None
    try:
        agent = JobAgent(role, watcher, run_root)
    except JobStoreError as exc:
        raise BadInput(str(exc), run_root) from exc
    watcher.plugins.insert(0, agent)  # before the live watch: a node relays its ranks' steps (on_message)
    for plugin in watcher.plugins:  # the divergence watch (job/divergence.py) judges on the head only
        join = getattr(plugin, "join_job", None)
        if join is not None:
            join(agent.fingerprints)
    watcher.decider = agent.decide
    watcher.writes_run_files = role.is_head
    return agent

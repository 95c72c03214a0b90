"""The per-step fingerprints across nodes (issue 38): each node relays its ranks' records (the "fp" lines,
probes/divergence.py) to the head through the job store, exactly once, so the head's judge (job/divergence.py)
compares the whole job; with --on-divergence stop the head's word (a step every rank agreed on, or stop) goes back
through the store and each node hands it to its own ranks.

Store keys: ``fp/N`` (node N's records not yet acknowledged, as job/relay.py's payload: [seq, rank, records, None]),
``fp-ack/N`` (the head took up to that sequence), ``fp-word`` (the head's word: ``{"ok": step, "stop": reason}``).
In stop mode the records and the word do not wait for a tick: a node puts at once and rings the head's bell
(``fp-bell``), the head's judge puts its new word at once and rings each node's (``fp-word-bell/N``); job/agent.py's
bell threads block on them (job/store.Bell). A record is ~50 bytes; the head's work is O(1) a record. Node side: called from the agent's thread and the
monitor's message thread (``lock``); head side: from the monitor's poll loop, which also feeds the judge."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypedDict

from ddpdoctor.job.relay import HeadRelay, NodeRelay

WORD = "fp-word"
# Stop mode's bells (job/store.Bell): a node rings HEAD_BELL once it put new records; the head rings each node's
# word bell once it put a new word. The ticks below stay as the fallback (a bell lost with a restarted head).
HEAD_BELL = "fp-bell"


def word_bell(node: int) -> str:
    return f"fp-word-bell/{node}"


class Word(TypedDict):
    """The head's word under ``fp-word``: every rank agreed up to step ``ok``; ``stop``: the verdict's reason."""

    ok: int
    stop: str | None


class DivergenceRelay:
    def __init__(self, node_rank: int, is_head: bool) -> None:
        self.node_rank, self.is_head = node_rank, is_head
        self.stop_mode = False  # --on-divergence stop: the word is read every tick, the records taken every poll
        self.lock = threading.Lock()
        self._take_lock = threading.Lock()
        self._node = NodeRelay()
        self._head = HeadRelay()
        self._seq = 0
        self._dirty = False
        self._word: Word | None = None  # the head's word, to put (the head) / last handed over (a node)
        self._word_put = False
        # Stop mode (job/agent.py): the head's new word goes out at once (put, and each node's bell rung) instead of
        # on its next tick; called from the thread that judged.
        self.on_word: Callable[[], None] | None = None

    # -- a node -----------------------------------------------------------------------------------------
    def add(self, rank: int, recs: Any) -> None:
        """A rank's "fp" line (its records as sent; the head's judge checks each)."""
        with self.lock:
            self._node.add(rank, recs, None)
            self._dirty = True

    def publish(self, store: Any, force: bool = False) -> None:
        """Put this node's unacknowledged records when new ones came (or ``force``: again, in case a put was lost)."""
        with self.lock:
            if not (self._dirty or force):
                return
            self._seq += 1
            payload = self._node.payload(self._seq)
            self._dirty = False
        if payload is not None:
            store.put(f"fp/{self.node_rank}", payload)

    def acked(self, seq: Any) -> None:
        with self.lock:
            self._node.acked(seq)

    def deliver(self, word: Any, monitor: Any) -> None:
        """The head's word, read off the store: new agreement or a stop goes to this node's ranks."""
        if not isinstance(word, dict):
            return
        ok, stop = word.get("ok"), word.get("stop")
        last: Word = self._word or {"ok": 0, "stop": None}
        send = getattr(monitor, "send", None)
        if send is None:
            return
        msgs: list[object] = []  # launch/monitor.MonitorRequest lines (not imported: launch/ is above job/)
        if isinstance(stop, str) and last["stop"] is None:
            msgs.append({"type": "divergence-stop", "reason": stop[:500]})
        if type(ok) is int and ok > last["ok"]:
            msgs.append({"type": "fp-ok", "step": ok})
        if not msgs:
            return
        self._word = {"ok": ok if type(ok) is int else last["ok"], "stop": stop if isinstance(stop, str) else None}
        for r in monitor.rank_ids():
            for m in msgs:
                send(r, m)

    # -- the head ---------------------------------------------------------------------------------------
    def take(self, store: Any, nodes: list[int], monitor: Any) -> None:
        """The other nodes' new records into this node's plugins (the judge), once; acknowledged."""
        with self._take_lock:  # the poll loop and the bell's thread (stop mode) both take: each record once
            self._take(store, nodes, monitor)

    def _take(self, store: Any, nodes: list[int], monitor: Any) -> None:
        got = store.get_many([f"fp/{n}" for n in nodes if n != self.node_rank])
        for name, payload in got.items():
            node = int(name.split("/")[1])
            before = self._head.taken.get(node, 0)
            for rank, recs, _ in self._head.take(node, payload):
                monitor.replay(rank, {"type": "fp", "fp": recs})
            if self._head.taken.get(node, 0) != before:
                store.put(f"fp-ack/{node}", self._head.taken[node])

    def word(self, ok: int | None = None, stop: str | None = None) -> None:
        """The head's judge: ``ok`` every rank agreed up to that step, or ``stop`` (the reason); put on next tick."""
        with self.lock:
            w: Word = {"ok": 0, "stop": None} if self._word is None else {**self._word}
            if ok is not None:
                w["ok"] = max(w["ok"], ok)
            if stop is not None:
                w["stop"] = stop[:500]
            self._word, self._word_put = w, False
        if self.on_word is not None:
            self.on_word()

    def put_word(self, store: Any) -> bool:
        """Put the head's new word; True when there was one."""
        with self.lock:
            if self._word is None or self._word_put:
                return False
            w, self._word_put = {**self._word}, True
        store.put(WORD, w)
        return True

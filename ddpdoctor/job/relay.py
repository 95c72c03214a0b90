"""Live health job-wide: each node relays its ranks' iteration records (the heartbeats' ``steps``) to the head through
the job store, exactly once, so the head's live watch (step series, slow-rank, slowdown, stall, `status`, the
Prometheus export) sees every rank of every node, with no shared filesystem.

A node keeps what it has not seen acknowledged (bounded per rank) and publishes it with a sequence number; the
head ingests what is newer than it has taken and acknowledges the sequence. A lost acknowledgement repeats a
publication, never a record: the head skips sequence numbers it has taken."""

from __future__ import annotations

from collections import deque
from typing import Any, TypedDict

MAX_PER_RANK = 64  # iteration records a node keeps per rank while the head has not taken them


class RelayPayload(TypedDict):
    """What a node publishes under ``live/N``: its items not yet acknowledged, each [seq, rank, steps, phase] (a
    compact list on the wire; ``steps`` as the rank's heartbeat gave them)."""

    items: list[list[Any]]


class NodeRelay:
    """The node's side: ``add`` from its monitor's messages, ``payload`` for a publication, ``acked`` on the head's
    acknowledgement."""

    def __init__(self) -> None:
        self._items: deque[list[Any]] = deque()  # [seq or None, rank, steps, phase]
        self._per_rank: dict[int, int] = {}

    def add(self, rank: int, steps: Any, phase: Any) -> None:
        if not isinstance(steps, list) or not steps:
            return
        steps = steps[-MAX_PER_RANK:]
        self._items.append([None, rank, steps, phase if isinstance(phase, str) else None])
        self._per_rank[rank] = self._per_rank.get(rank, 0) + len(steps)
        while self._per_rank[rank] > MAX_PER_RANK and self._items:
            old = self._items.popleft()  # the oldest first: a head that does not read loses history, not memory
            self._per_rank[old[1]] -= len(old[2])

    def payload(self, seq: int) -> RelayPayload | None:
        """What to publish now (every item not yet acknowledged; new ones take ``seq``); None when nothing waits."""
        if not self._items:
            return None
        for item in self._items:
            if item[0] is None:
                item[0] = seq
        return {"items": list(self._items)}

    def acked(self, seq: Any) -> None:
        if not isinstance(seq, int):
            return
        while self._items and self._items[0][0] is not None and self._items[0][0] <= seq:
            old = self._items.popleft()
            self._per_rank[old[1]] -= len(old[2])


class HeadRelay:
    """The head's side: what is new in each node's publication, and the acknowledgement to write back."""

    def __init__(self) -> None:
        self.taken: dict[int, int] = {}

    def take(self, node: int, payload: Any) -> list[tuple[int, Any, Any]]:
        """(rank, steps, phase) of the items newer than what was taken from ``node``; junk is skipped."""
        if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
            return []
        last = self.taken.get(node, 0)
        out = []
        top = last
        for item in payload["items"]:
            if not (isinstance(item, list) and len(item) == 4
                    and all(isinstance(v, int) and not isinstance(v, bool) for v in item[:2])):
                continue
            if item[0] > last:
                out.append((item[1], item[2], item[3]))
                top = max(top, item[0])
        self.taken[node] = top
        return out

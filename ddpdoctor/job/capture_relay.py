"""`ddpdoctor capture` job-wide through the job store: the head hands a capture request to every node; each node's
live watch relays it to its own ranks, whose window files land in that node's run directory; the node then sends
each rank's part of the window (once the rank wrote its done.json), its capture record and its stacks back through
the store, and the head writes them into its own window folder. So the client on the head sees every rank of every
node, with no shared filesystem; the files stay in each node's own run directory as well.

Bounded: a rank's part is sent once, at most MAX_RANK_BYTES of files (a larger trace stays in its node's run
directory, and the record says so); the head deletes each value from the store once it has written it. Names are
checked on both sides: a relayed file can only land under the window's ``ranks/rankR/`` or ``traces/``, as a new
private file, never through a link."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

from ddpdoctor.safe_io import write_atomic

MAX_RANK_BYTES = 16 << 20  # raw bytes of one rank's window files sent through the store (base64 adds a third)
MAX_REQUESTS = 8  # the head keeps its last few requests in the store: a node that polls late still sees them
CAPTURE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FILE = re.compile(r"^(ranks/rank\d{1,7}/[A-Za-z0-9_.-]{1,128}|traces/[A-Za-z0-9_.-]{1,200})$")
_RANK_TRACE = re.compile(r"^rank(\d{1,7})\.")


class CaptureRequest(TypedDict, total=False):
    """A capture request: what `ddpdoctor capture` leaves in a node's control folder (live/capture.py), and what
    the head's live watch hands every other node through the store: which window (``what``: "profile",
    "check-sync" or "stacks"; ``steps``), from which iteration on (``at_step``: several nodes start on the same
    one), why."""

    id: str
    what: str
    steps: int | None  # None: a kind without a window ("stacks"), as `ddpdoctor capture` writes it
    at_step: int
    reason: str


class PublishedRequests(TypedDict):
    """The store's "capture" value: the head's last few requests."""

    reqs: list[CaptureRequest]


class WindowRecord(TypedDict):
    """A node's capture record for one window (its live watch's record, its stacks and the ranks' replies), as it
    goes back to the head."""

    record: str
    stacks: str | None
    replies: str
    dir: str
    name: str


class RankParts(TypedDict):
    """One rank's window files as they go back to the head: {relative path: base64}, and those too large."""

    files: dict[str, str]
    left_out: list[str]


def capture_request(raw: Mapping[str, object]) -> CaptureRequest:
    """The keys of a request a node acts on, from the live watch's request or the store (raw JSON in: a value of
    the wrong type is left out)."""
    out: CaptureRequest = {}
    if isinstance(cid := raw.get("id"), str):
        out["id"] = cid
    if isinstance(what := raw.get("what"), str):
        out["what"] = what
    if isinstance(steps := raw.get("steps"), int) and not isinstance(steps, bool):
        out["steps"] = steps
    if isinstance(at := raw.get("at_step"), int) and not isinstance(at, bool):
        out["at_step"] = at
    if isinstance(reason := raw.get("reason"), str):
        out["reason"] = reason
    return out


def window(run_root: Path, cid: str) -> Path:
    return run_root / "captures" / cid


def record_key(node: int, cid: str) -> str:
    return f"cap/{node}/{cid}/record"


def rank_key(node: int, cid: str, rank: int) -> str:
    return f"cap/{node}/{cid}/rank{rank}"


def _read(path: Path, limit: int) -> bytes | None:
    """A regular file's bytes (never through a link), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > limit:
            return None
        chunks, left = [], st.st_size
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


class NodeCaptures:
    """A node's side: the requests it took from the head, and what of their windows it has sent back."""

    def __init__(self, node: int, run_root: Path) -> None:
        self.node, self.run_root = node, run_root
        self.taken: set[str] = set()
        self._sent_record: dict[str, bytes] = {}
        self._sent_ranks: set[tuple[str, int]] = set()

    def new_requests(self, published: object) -> list[CaptureRequest]:
        """The head's requests this node has not taken yet (``published``: the store's raw value; junk is
        skipped)."""
        reqs = published.get("reqs") if isinstance(published, dict) else None
        out = []
        for raw in reqs if isinstance(reqs, list) else []:
            req = capture_request(raw) if isinstance(raw, dict) else {}
            cid = req.get("id")
            if cid is not None and CAPTURE_ID.match(cid) and cid not in self.taken:
                self.taken.add(cid)
                out.append(req)
        return out

    def outgoing(self) -> list[tuple[str, WindowRecord | RankParts]]:
        """(store name, value) for every part of a taken window that is new: the node's record (with its stacks
        and the ranks' replies) whenever it changed, and each rank's files once its done.json exists."""
        out: list[tuple[str, WindowRecord | RankParts]] = []
        for cid in sorted(self.taken):
            win = window(self.run_root, cid)
            # The live watch names this node node<N> (torchrun) or rank<N> (--launcher none: a node per rank).
            live = next((f"{k}{self.node}" for k in ("node", "rank")
                         if (win / f"capture-{k}{self.node}.json").is_file()), None)
            rec = _read(win / f"capture-{live}.json", 1 << 20) if live else None
            if live is None or rec is None:
                continue
            stacks = _read(win / f"stacks-{live}.json", 64 << 20)
            replies = _read(win / "replies.jsonl", 1 << 20)
            blob = rec + b"\0" + (stacks or b"") + b"\0" + (replies or b"")
            if self._sent_record.get(cid) != blob:
                self._sent_record[cid] = blob
                out.append((record_key(self.node, cid), {
                    "record": rec.decode("utf-8", "replace"), "stacks": None if stacks is None else
                    stacks.decode("utf-8", "replace"), "replies": (replies or b"").decode("utf-8", "replace"),
                    "dir": str(win), "name": live}))
            for rank in self._done_ranks(win):
                if (cid, rank) not in self._sent_ranks:
                    self._sent_ranks.add((cid, rank))
                    out.append((rank_key(self.node, cid, rank), self._rank_files(win, rank)))
        return out

    @staticmethod
    def _done_ranks(win: Path) -> list[int]:
        try:
            names = [e.name for e in os.scandir(win / "ranks") if e.name.startswith("rank")]
        except OSError:
            return []
        return sorted(int(n[4:]) for n in names if n[4:].isdigit() and (win / "ranks" / n / "done.json").is_file())

    @staticmethod
    def _rank_files(win: Path, rank: int) -> RankParts:
        """The rank's window files as {relative path: base64}; done.json is written last on the head."""
        files: dict[str, str] = {}
        left_out: list[str] = []
        budget = MAX_RANK_BYTES
        paths = []
        try:
            paths += [f"ranks/rank{rank}/{e.name}" for e in os.scandir(win / "ranks" / f"rank{rank}")]
        except OSError:
            pass
        try:
            paths += [f"traces/{e.name}" for e in os.scandir(win / "traces")
                      if (m := _RANK_TRACE.match(e.name)) and int(m.group(1)) == rank]
        except OSError:
            pass
        for rel in sorted(paths, key=lambda p: p.endswith("/done.json")):  # done.json last
            if not _FILE.match(rel):
                continue
            data = _read(win / rel, budget)
            if data is None:
                left_out.append(rel)
                continue
            budget -= len(data)
            files[rel] = base64.b64encode(data).decode("ascii")
        return {"files": files, "left_out": left_out}


class HeadCaptures:
    """The head's side: the requests it forwarded, and writing what the nodes sent back into its window folder."""

    def __init__(self, run_root: Path) -> None:
        self.run_root = run_root
        self.requests: list[CaptureRequest] = []
        self.waiting: dict[str, list[int]] = {}  # capture id -> nodes asked
        self._ranks: dict[tuple[str, int], set[int]] = {}  # (cid, node) -> ranks still to take
        self._taken: set[tuple[str, int, int]] = set()
        self._records: dict[tuple[str, int], str] = {}  # the last record written per (cid, node)
        self.left_out: dict[str, dict[int, list[str]]] = {}  # cid -> rank -> files too large to relay

    def forward(self, req: Mapping[str, object], nodes: list[int]) -> PublishedRequests:
        """Remember ``req`` (its keys a node acts on) for ``nodes``; the value to publish under "capture" (the last
        few requests)."""
        self.requests = [*self.requests, capture_request(req)][-MAX_REQUESTS:]
        self.waiting[str(req.get("id"))] = list(nodes)
        for old in list(self.waiting)[:-MAX_REQUESTS]:
            del self.waiting[old]
        return {"reqs": self.requests}

    def names(self) -> list[str]:
        """The store names to read now: every waiting node's record, and the ranks it said it asked."""
        out = []
        for cid, nodes in self.waiting.items():
            for n in nodes:
                out.append(record_key(n, cid))
                out += [rank_key(n, cid, r) for r in sorted(self._ranks.get((cid, n), ()))]
        return out

    def take(self, got: Mapping[str, object]) -> list[str]:
        """``got``: the store's raw values by name (each checked here)."""
        """Write what arrived; return the names of the ranks' parts taken (the caller deletes them from the store)."""
        done = []
        for name, value in got.items():
            parts = name.split("/")
            if len(parts) != 4 or not parts[1].isdigit() or not CAPTURE_ID.match(parts[2]) \
                    or parts[2] not in self.waiting or not isinstance(value, dict):
                continue
            node, cid, what = int(parts[1]), parts[2], parts[3]
            win = window(self.run_root, cid)
            if what == "record":
                # Kept in the store (small, replaced by the node as it changes): deleting it could drop a newer one.
                key = repr(sorted(value.items()))
                if self._records.get((cid, node)) != key:
                    self._records[(cid, node)] = key
                    self._record(win, cid, node, value)
            elif what.startswith("rank") and what[4:].isdigit():
                rank = int(what[4:])
                if (cid, node, rank) not in self._taken:
                    self._taken.add((cid, node, rank))
                    self._files(win, value)
                    lo = value.get("left_out")
                    if isinstance(lo, list) and lo:
                        import json

                        # Too large for the store: say where they are (live/capture.relay_note reads it).
                        self.left_out.setdefault(cid, {})[rank] = [str(x)[:200] for x in lo[:8]]
                        _write(win / "relay.json", json.dumps({"left_out": self.left_out[cid]}).encode(), True)
                self._ranks.get((cid, node), set()).discard(rank)
                done.append(name)
        return done

    def _record(self, win: Path, cid: str, node: int, value: Mapping[str, object]) -> None:
        """``value``: a node's WindowRecord as read off the store (raw JSON: each value checked)."""
        import json

        try:
            rec = json.loads(str(value.get("record")))
        except ValueError:
            return
        if not isinstance(rec, dict):
            return
        ranks = rec.get("ranks")
        if isinstance(ranks, list):
            left = {int(r) for r in ranks if isinstance(r, int)} - {r for (c, n, r) in self._taken
                                                                      if c == cid and n == node}
            self._ranks[(cid, node)] = left
        live = value.get("name") if value.get("name") in (f"node{node}", f"rank{node}") else f"node{node}"
        rec["relayed_from"] = {"node": node, "dir": str(value.get("dir"))[:500]}
        try:
            mine = json.loads((win / f"capture-{live}.json").read_text())
        except (OSError, ValueError):
            mine = None
        if isinstance(mine, dict) and "relayed_from" not in mine:
            return  # the node wrote it here itself (a shared filesystem): its own file is the newest
        win.mkdir(mode=0o700, parents=True, exist_ok=True)
        replies, stacks = value.get("replies"), value.get("stacks")
        if isinstance(replies, str) and replies:
            _write(win / f"replies-{live}.jsonl", replies.encode(), replace=True)
        if isinstance(stacks, str):
            _write(win / f"stacks-{live}.json", stacks.encode(), replace=True)
        _write(win / f"capture-{live}.json", json.dumps(rec).encode(), replace=True)

    @staticmethod
    def _files(win: Path, value: Mapping[str, object]) -> None:
        """``value``: a node's RankParts as read off the store (raw JSON: each value checked)."""
        files = value.get("files")
        if not isinstance(files, dict):
            return
        for rel, b64 in files.items():  # in the node's order: done.json last
            if not isinstance(rel, str) or not _FILE.match(rel) or ".." in rel or not isinstance(b64, str):
                continue
            try:
                data = base64.b64decode(b64, validate=True)
            except ValueError:
                continue
            _write(win / rel, data, replace=False)


def _write(path: Path, data: bytes, replace: bool) -> None:
    """A private file in the window folder: new (``replace`` False: an existing file is kept), or replaced whole
    through a temporary name; never through a link."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if replace:
            write_atomic(path, data)  # an unpredictable temporary name, O_EXCL|O_NOFOLLOW, renamed into place
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError:
        pass

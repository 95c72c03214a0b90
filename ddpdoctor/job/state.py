"""The job's state (one typed record per rank, job/record.py; one envelope per node) and the job-wide rules on it:
lost nodes, hang with culprit (findings/hang.py's rules, on every rank of every node), collective mismatch and
crash root cause. The stall rule itself is job/rules.py.

Times in a record are ages measured on the publishing node's own clock ("seconds since the step started, as of
publishing"); the head adds how long ago *it* received the node's latest envelope. No two hosts' clocks are compared."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TypedDict

from ddpdoctor.findings.hang import HangDiagnosis, RankPosition, diagnose_hang, position
from ddpdoctor.job.grouping import rank_ranges
from ddpdoctor.job.record import VERSION, RankRecord, decode, encode, record
from ddpdoctor.rundir.records import Beat, CollectiveState, RankExitDoc, RankStatusDoc

__all__ = ["VERSION", "NodeEnvelope", "NodeState", "RankRecord", "envelope", "record"]


class NodeEnvelope(TypedDict):
    """What a node publishes under ``node/N`` in the job store (versioned: ``v``): its ranks' records as one JSON
    text (job/record.encode), a sequence number that moves on every publication, its job's exit code once over."""

    v: int
    node: int
    host: str
    seq: int
    ranks: str
    end: int | None


@dataclass
class NodeState:
    """What the head knows of one node: its latest envelope, and when (head's clock) its seq last moved."""

    node: int
    host: str = "?"
    ranks: list[RankRecord] = field(default_factory=list)
    seq: int = -1
    received: float = 0.0
    end: int | None = None  # the node's job exit code, once its launcher finished
    lost: bool = False

    def update(self, env: object, now: float) -> None:
        """Take a newer envelope (a NodeEnvelope; a repeated seq is the same publication: its age keeps growing).
        It is raw JSON off the store, so it is taken as a plain object and each value checked as it is read."""
        if not isinstance(env, dict):
            return
        seq = int(env.get("seq", -1))
        if seq != self.seq:
            self.seq, self.received = seq, now
            self.host = str(env.get("host") or self.host)
            self.ranks = decode(env.get("ranks"))
            end = env.get("end")
            self.end = end if isinstance(end, int) else None
            self.lost = False


def envelope(node: int, host: str, seq: int, ranks: list[RankRecord], end: int | None = None) -> NodeEnvelope:
    """What a node publishes: its ranks' records, a sequence number that moves on every publication."""
    return {"v": VERSION, "node": node, "host": host, "seq": seq, "ranks": encode(ranks), "end": end}


# -- job-wide rules ------------------------------------------------------------------------------------
def lost_nodes(nodes: dict[int, NodeState], now: float, after_s: float) -> list[int]:
    """Nodes still running whose envelope has not moved for ``after_s`` (their monitor, launcher or host died)."""
    return sorted(n for n, st in nodes.items() if st.end is None and st.seq >= 0 and now - st.received > after_s)


def rank_age(rec: RankRecord, st: NodeState, now: float) -> float:
    """Seconds the rank has been in its current step, on the head's clock."""
    return rec.age_s + max(0.0, now - st.received)


def slowest_step(nodes: dict[int, NodeState]) -> float:
    return max((r.slowest_s or 0.0 for st in nodes.values() for r in st.ranks), default=0.0)


def live_records(nodes: dict[int, NodeState], now: float) -> tuple[list[RankRecord], dict[int, float]]:
    """The records the stall rule judges (ranks of nodes neither lost nor ended) and, per rank, how long ago the
    head received its node's envelope (added to its step age: the step is that much older now)."""
    recs: list[RankRecord] = []
    extra: dict[int, float] = {}
    for st in nodes.values():
        if st.lost or st.end is not None:
            continue
        late = max(0.0, now - st.received)
        for rec in st.ranks:
            recs.append(rec)
            extra[rec.rank] = late
    return recs, extra


def stalled_ranks(nodes: dict[int, NodeState], now: float, timeout: float, startup_timeout: float) -> list[int]:
    """Live ranks (of nodes not lost) whose step has not advanced within the timeout (start-up: startup_timeout)."""
    from ddpdoctor.job.rules import Limits, decide

    recs, extra = live_records(nodes, now)
    return decide(recs, Limits(timeout, startup_timeout), 0.0, extra_age_s=extra).stalled


def to_position(rec: RankRecord | None, rank: int) -> RankPosition:
    """A record as the hang rules' RankPosition (through findings.hang.position, so both agree)."""
    if rec is None or (rec.step is None and rec.exit is None):
        return RankPosition(rank, "no-heartbeat")
    beat: Beat = {"where": rec.where}
    if rec.step is not None:
        beat["step"] = rec.step
    if rec.phase is not None:
        beat["phase"] = rec.phase
    if rec.data_dry is not None:
        beat["data_dry"] = rec.data_dry
    c = rec.coll
    if c and len(c) >= 4:
        coll: CollectiveState = {"op": c[0], "group": c[1], "seq": c[2], "call_site": c[3], "sizes": rec.sizes or []}
        if len(c) > 4 and isinstance(c[4], str):
            coll["unit"] = c[4]
        beat["collective"] = coll
    x = rec.exit
    exit_info: RankExitDoc | None = {"exit_code": x[0], "exception": x[1], "steps_completed": x[2],
                                     "exit_site": x[3] if len(x) > 3 else None} if x and len(x) >= 3 else None
    if exit_info is not None and "collective" in beat:
        beat["last_collective"] = beat["collective"]
    return position(rank, beat if rec.step is not None else None, exit_info)


def positions(nodes: dict[int, NodeState], world_size: int | None) -> tuple[dict[int, RankPosition], dict[int, int]]:
    """Every rank's position (ranks of lost nodes and ranks nobody published: no-heartbeat), and rank -> node."""
    recs: dict[int, RankRecord] = {}
    node_of: dict[int, int] = {}
    lost: set[int] = set()
    for n, st in nodes.items():
        for rec in st.ranks:
            recs[rec.rank] = rec
            node_of[rec.rank] = n
            if st.lost:
                lost.add(rec.rank)
    ranks = range(world_size) if world_size else sorted(recs)
    out = {r: (RankPosition(r, "no-heartbeat") if r in lost else to_position(recs.get(r), r)) for r in ranks}
    return out, node_of


_LIST = re.compile(r"\[(\d+(?:, \d+)*)\]")


def compact_reason(reason: str) -> str:
    """The node-local reason with its rank lists as ranges (``[0, 1, 2, 5]`` -> ``0-2,5``): readable at 4,096."""
    return _LIST.sub(lambda m: rank_ranges(int(x) for x in m.group(1).split(", ")), reason)


def diagnose(nodes: dict[int, NodeState], world_size: int | None, stalled: list[int],
             where: tuple[dict[int, RankPosition], dict[int, int]] | None = None) -> HangDiagnosis:
    """The hang's culprit across the job: findings.hang.diagnose_hang on every rank's position; ranks of a lost node
    are culprits of kind ``lost-node``. ``where``: positions(nodes, world_size) when the caller has them already."""
    pos, node_of = where if where is not None else positions(nodes, world_size)
    d = diagnose_hang(pos, stalled)
    lost = {n: st for n, st in nodes.items() if st.lost}
    lost_ranks = sorted(r for r in pos if node_of.get(r) in lost)
    if lost_ranks and (set(d.culprit_ranks) & set(lost_ranks) or d.kind == "unknown"):
        waiting = sorted(r for r, p in pos.items() if p.state == "in-collective")
        names = ", ".join(f"node {n} ({st.host})" for n, st in sorted(lost.items()))
        d.kind = "lost-node"
        d.culprit_ranks = lost_ranks
        d.reason = (f"{names} stopped publishing (its host, launcher or monitor died): rank(s) {lost_ranks} lost"
                    + (f" while rank(s) {waiting} wait in a collective" if waiting else ""))
    if d.kind == "mismatch" and len(pos) > 8:
        d.reason = "ranks are in different collectives at the same point: " + "; ".join(
            f"ranks {rank_ranges(rs)}: {k}" for k, rs in _by_collective(pos).items())
    d.reason = compact_reason(d.reason)
    return d


def _by_collective(pos: dict[int, RankPosition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r, p in sorted(pos.items()):
        if p.state == "in-collective":
            out.setdefault(f"{p.op} #{p.seq} on {p.group} at {p.call_site}", []).append(r)
    return dict(sorted(out.items(), key=lambda kv: len(kv[1])))


def statuses(nodes: dict[int, NodeState]) -> dict[int, RankStatusDoc | None]:
    """Every published rank's status as findings.crash.crash_findings reads status.json (None: still running)."""
    out: dict[int, RankStatusDoc | None] = {}
    for st in nodes.values():
        for rec in st.ranks:
            x = rec.exit
            if not x or len(x) < 3:
                out[rec.rank] = None
                continue
            c = rec.coll
            failed: CollectiveState | None = ({"op": c[0], "group": c[1], "seq": c[2], "call_site": c[3]}
                                              if c and len(c) >= 4 else None)
            out[rec.rank] = {"exit_code": x[0], "exception": x[1], "steps_completed": x[2], "failed_collective": failed}
    return out


def crash_root(nodes: dict[int, NodeState]) -> list[int]:
    """The rank(s) whose failure is the root cause (crash_findings' rules, job-wide); [] when none failed."""
    from ddpdoctor.findings.crash import crash_findings

    st = {r: s for r, s in statuses(nodes).items() if s and s.get("exception")}
    return sorted({r for f in crash_findings(st) if f.id == "rank-crashed" for r in f.ranks})

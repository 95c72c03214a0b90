"""The job's state as plain data (one compact, versioned record per rank, one envelope per node) and the job-wide
rules on it: stalled ranks, lost nodes, hang with culprit (the node-local rules of findings/hang.py, on every rank
of every node), collective mismatch and crash root cause.

Times in a record are ages measured on the publishing node's own clock ("seconds since the step started, as of
publishing"); the head adds how long ago *it* received the node's latest envelope. No two hosts' clocks are compared."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.findings.hang import DDP_BUCKETS, HangDiagnosis, RankPosition, diagnose_hang, position
from ddpdoctor.job.grouping import rank_ranges

VERSION = 1
MAX_SIZES = 4  # tensor shapes kept per collective record: enough to tell a mismatch, bounded at any scale
MAX_TEXT = 300  # characters of an exception or call site kept per record


def _cut(s: Any, n: int = MAX_TEXT) -> str | None:
    return None if s is None else str(s)[:n]


def record(rank: int, beat: dict[str, Any] | None, exit_info: dict[str, Any] | None, now: float,
           job_started: float) -> dict[str, Any]:
    """One rank's compact state from its last heartbeat (the monitor's ``RankLink.beat``) and exit message.

    Keys: r rank, s step, p phase, c [op, group, seq, call site] of the collective it is in (DDP's bucket
    all-reduce during backward counts), z its tensor sizes, w where the main thread is, a seconds since the
    current step (or the job) started, l seconds since the last beat, m slowest step so far, x [exit code,
    exception head, steps completed] once it ended. Absent keys are None."""
    b = beat or {}
    rec: dict[str, Any] = {"r": rank}
    if beat is not None:
        rec["s"] = b.get("step") or 0
        rec["p"] = b.get("phase")
        coll, bw = b.get("collective"), b.get("backward")
        if coll:
            rec["c"] = [coll.get("op"), coll.get("group"), coll.get("seq"), _cut(coll.get("call_site"))]
            if coll.get("sizes"):
                rec["z"] = [list(s)[:8] for s in coll["sizes"][:MAX_SIZES]]
        elif bw and b.get("phase") == "backward":
            rec["c"] = [DDP_BUCKETS, bw.get("group"), bw.get("seq"), _cut(bw.get("call_site"))]
        rec["w"] = _cut(b.get("where") or ((b.get("last_collective") or {}).get("call_site")))
        started = b.get("step_started") if rec["s"] else None
        rec["a"] = round(now - (started or job_started), 2)
        if b.get("time"):
            rec["l"] = round(max(0.0, now - b["time"]), 2)
        if b.get("max_step_s"):
            rec["m"] = round(b["max_step_s"], 3)
    else:
        rec["a"] = round(now - job_started, 2)
    if exit_info is not None:
        rec["x"] = [exit_info.get("exit_code"), _cut(exit_info.get("exception")), exit_info.get("steps_completed")]
    return rec


@dataclass
class NodeState:
    """What the head knows of one node: its latest envelope, and when (head's clock) its seq last moved."""

    node: int
    host: str = "?"
    ranks: list[dict[str, Any]] = field(default_factory=list)
    seq: int = -1
    received: float = 0.0
    end: int | None = None  # the node's job exit code, once its launcher finished
    lost: bool = False

    def update(self, env: dict[str, Any], now: float) -> None:
        """Take a newer envelope (a repeated seq is the same publication: its age keeps growing)."""
        seq = int(env.get("seq", -1))
        if seq != self.seq:
            self.seq, self.received = seq, now
            self.host = str(env.get("host") or self.host)
            self.ranks = [r for r in env.get("ranks") or [] if isinstance(r, dict) and isinstance(r.get("r"), int)]
            self.end = env.get("end") if isinstance(env.get("end"), int) else None
            self.lost = False


def envelope(node: int, host: str, seq: int, ranks: list[dict[str, Any]], end: int | None = None) -> dict[str, Any]:
    """What a node publishes: its ranks' records, a sequence number that moves on every publication."""
    return {"v": VERSION, "node": node, "host": host, "seq": seq, "ranks": ranks, "end": end}


# -- job-wide rules ------------------------------------------------------------------------------------
def lost_nodes(nodes: dict[int, NodeState], now: float, after_s: float) -> list[int]:
    """Nodes still running whose envelope has not moved for ``after_s`` (their monitor, launcher or host died)."""
    return sorted(n for n, st in nodes.items() if st.end is None and st.seq >= 0 and now - st.received > after_s)


def rank_age(rec: dict[str, Any], st: NodeState, now: float) -> float:
    """Seconds the rank has been in its current step, on the head's clock."""
    return float(rec.get("a") or 0.0) + max(0.0, now - st.received)


def slowest_step(nodes: dict[int, NodeState]) -> float:
    return max((float(r.get("m") or 0.0) for st in nodes.values() for r in st.ranks), default=0.0)


def stalled_ranks(nodes: dict[int, NodeState], now: float, timeout: float, startup_timeout: float) -> list[int]:
    """Live ranks (of nodes not lost) whose step has not advanced within the timeout (start-up: startup_timeout)."""
    out = []
    for st in nodes.values():
        if st.lost or st.end is not None:
            continue
        for rec in st.ranks:
            if rec.get("x") is not None:
                continue
            limit = timeout if rec.get("s") else startup_timeout
            if rank_age(rec, st, now) > limit:
                out.append(rec["r"])
    return sorted(out)


def to_position(rec: dict[str, Any] | None, rank: int) -> RankPosition:
    """A record as the node-local rules' RankPosition (through findings.hang.position, so both agree)."""
    if rec is None or ("s" not in rec and rec.get("x") is None):
        return RankPosition(rank, "no-heartbeat")
    beat: dict[str, Any] = {"step": rec.get("s"), "phase": rec.get("p"), "where": rec.get("w")}
    c = rec.get("c")
    if c:
        beat["collective"] = {"op": c[0], "group": c[1], "seq": c[2], "call_site": c[3], "sizes": rec.get("z") or []}
    x = rec.get("x")
    exit_info = {"exit_code": x[0], "exception": x[1], "steps_completed": x[2]} if x is not None else None
    if x is not None and c:
        beat["last_collective"] = beat["collective"]
    return position(rank, beat if "s" in rec else None, exit_info)


def positions(nodes: dict[int, NodeState], world_size: int | None) -> tuple[dict[int, RankPosition], dict[int, int]]:
    """Every rank's position (ranks of lost nodes and ranks nobody published: no-heartbeat), and rank -> node."""
    recs: dict[int, dict[str, Any]] = {}
    node_of: dict[int, int] = {}
    lost: set[int] = set()
    for n, st in nodes.items():
        for rec in st.ranks:
            recs[rec["r"]] = rec
            node_of[rec["r"]] = n
            if st.lost:
                lost.add(rec["r"])
    ranks = range(world_size) if world_size else sorted(recs)
    out = {r: (RankPosition(r, "no-heartbeat") if r in lost else to_position(recs.get(r), r)) for r in ranks}
    return out, node_of


_LIST = re.compile(r"\[(\d+(?:, \d+)*)\]")


def compact_reason(reason: str) -> str:
    """The node-local reason with its rank lists as ranges (``[0, 1, 2, 5]`` -> ``0-2,5``): readable at 4,096."""
    return _LIST.sub(lambda m: rank_ranges(int(x) for x in m.group(1).split(", ")), reason)


def diagnose(nodes: dict[int, NodeState], world_size: int | None, stalled: list[int]) -> HangDiagnosis:
    """The hang's culprit across the job: findings.hang.diagnose_hang on every rank's position; ranks of a lost node
    are culprits of kind ``lost-node``."""
    pos, node_of = positions(nodes, world_size)
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


def statuses(nodes: dict[int, NodeState]) -> dict[int, dict[str, Any] | None]:
    """Every published rank's status as findings.hang.crash_findings reads status.json (None: still running)."""
    out: dict[int, dict[str, Any] | None] = {}
    for st in nodes.values():
        for rec in st.ranks:
            x = rec.get("x")
            if x is None:
                out[rec["r"]] = None
                continue
            c = rec.get("c")
            out[rec["r"]] = {"exit_code": x[0], "exception": x[1], "steps_completed": x[2],
                             "failed_collective": {"op": c[0], "group": c[1], "seq": c[2], "call_site": c[3]} if c else None}
    return out


def crash_root(nodes: dict[int, NodeState]) -> list[int]:
    """The rank(s) whose failure is the root cause (crash_findings' rules, job-wide); [] when none failed."""
    from ddpdoctor.findings.hang import crash_findings

    st = {r: s for r, s in statuses(nodes).items() if s and s.get("exception")}
    return sorted({r for f in crash_findings(dict(st)) if f.id == "rank-crashed" for r in f.ranks})

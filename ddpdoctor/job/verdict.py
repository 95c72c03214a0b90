"""The one typed hang verdict, for a job of one node or many: what hung, when it was seen, the diagnosis, every
rank's stack and Flight Recorder dump; RUN/hang.json is its to_json(). The node monitor and the job's head build
it the same way; a job of many nodes adds its rank classes and its nodes. HeadLost: what a node says when the job's
head is gone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict, final

from ddpdoctor.findings.hang import HangDiagnosis, RankPosition, reconcile
from ddpdoctor.job import state
from ddpdoctor.job.record import RankRecord
from ddpdoctor.job.rules import Limits
from ddpdoctor.jsontypes import JsonValue
from ddpdoctor.rundir.records import Beat, HangDoc, HangNodeDoc, HeadLostDoc, RankClassDoc, RankStateDoc


@dataclass
class HangVerdict:
    detected_after_s: float  # seconds without progress when the rule called it a hang
    hang_timeout_s: float
    hang_timeout_set: bool  # the user's --hang-timeout (else the automatic one)
    startup_timeout_s: float
    in_startup: bool  # no rank had completed a step
    on_hang: str  # kill | report
    diagnosis: HangDiagnosis
    stacks: dict[int, str | None] = field(default_factory=dict)
    flight_recorder: dict[int, JsonValue] = field(default_factory=dict)  # torch's own JSON, passed through
    reported_after_s: float = 0.0  # detection plus collecting stacks and dumps (bounded by timeout + 5 s)
    heartbeats: dict[int, Beat | None] | None = None  # one node: each rank's last heartbeat
    classes: list[RankClassDoc] | None = None  # many nodes: ranks grouped by state and stack
    nodes: dict[int, HangNodeDoc] | None = None  # many nodes: host, lost, ranks of each

    def to_json(self) -> HangDoc:
        out: HangDoc = {
            "detected_after_s": self.detected_after_s, "hang_timeout_s": self.hang_timeout_s,
            "hang_timeout_set": self.hang_timeout_set, "startup_timeout_s": self.startup_timeout_s,
            "in_startup": self.in_startup, "on_hang": self.on_hang, "diagnosis": self.diagnosis.to_json(),
            "stacks": {str(r): s for r, s in self.stacks.items()},
        }
        if self.heartbeats is not None:
            out["heartbeats"] = {str(r): b for r, b in self.heartbeats.items()}
        if self.classes is not None:
            out["classes"] = self.classes
        if self.nodes is not None:
            out["nodes"] = {str(n): v for n, v in self.nodes.items()}
        out["flight_recorder"] = {str(r): d for r, d in self.flight_recorder.items()}
        out["reported_after_s"] = self.reported_after_s
        return out


def build(nodes: dict[int, state.NodeState], world_size: int | None, stalled: list[int], now: float, *,
          limits: Limits, timeout_s: float, on_hang: str, stacks: dict[int, str | None],
          dumps: dict[int, JsonValue], since_start_s: float | None = None,
          where: tuple[dict[int, RankPosition], dict[int, int]] | None = None) -> HangVerdict:
    """The one builder of the hang verdict, for a job of one node (its monitor's records as one NodeState) and on
    the head of many (every node's): the culprit from every rank's typed record (job/state.diagnose, the rules of
    findings/hang.py), how long the stalled ranks had made no progress (the most recent of their steps' starts,
    on the head's clock; ``since_start_s``, the job's age, when no stalled rank ever reported), each rank's stack
    and Flight Recorder dump. The caller adds what only it has (one node:
    the raw heartbeats; many: rank classes and nodes) and ``reported_after_s`` once the verdict is out."""
    d = reconcile(state.diagnose(nodes, world_size, stalled, where), stacks, dumps)
    still = set(stalled)  # a set: 32,768 stalled ranks looked up in a list was 15 s of the head's verdict
    ages = [state.rank_age(r, st, now) for st in nodes.values() for r in st.ranks if r.rank in still]
    return HangVerdict(
        detected_after_s=round(min(ages) if ages else since_start_s if since_start_s is not None else timeout_s, 2),
        hang_timeout_s=timeout_s,
        hang_timeout_set=limits.hang_timeout is not None, startup_timeout_s=limits.startup_timeout,
        in_startup=all(not r.step for st in nodes.values() for r in st.ranks), on_hang=on_hang, diagnosis=d,
        stacks=stacks, flight_recorder=dumps)


class _HeadWordHead(TypedDict):
    line: str
    code: int
    head: str
    report: str


class HeadWordDoc(_HeadWordHead, total=False):
    """HeadWord as it goes through the job store."""

    on_hang: str


@final
class RemoteVerdict(HeadWordDoc):
    """The head's hang verdict as another node acts on it (its monitor's ``hang``: that node writes no hang.json)."""

    remote: bool


@dataclass(frozen=True)
class HeadWord:
    """What the head tells every node through the job store: its hang verdict as it declares it (``verdict``) or
    the job's end (``final``): the job's one line, its exit code (0/1), the head's host and where its report is."""

    line: str
    code: int
    head: str
    report: str
    on_hang: str | None = None  # a hang verdict: what every node does with its ranks (kill | report)

    def to_json(self) -> HeadWordDoc:
        out: HeadWordDoc = {"line": self.line, "code": self.code, "head": self.head, "report": self.report}
        if self.on_hang is not None:
            out["on_hang"] = self.on_hang
        return out

    @classmethod
    def from_json(cls, raw: object) -> HeadWord | None:
        """The head's word as read off the store; None for anything else (a value of another version, junk)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("code"), int) or isinstance(raw.get("code"), bool):
            return None
        on_hang = raw.get("on_hang")
        return cls(str(raw.get("line")), int(raw["code"]), str(raw.get("head")), str(raw.get("report")),
                   on_hang if isinstance(on_hang, str) else None)


@dataclass
class HeadLost:
    """What a node that lost the job's head knows (docs/hangs.md#lost-head): the head's address, its own ranks'
    last state (typed records), the last verdict the head had handed out, if any. Its exit code is 1: a node of
    the job died, so the job did not complete as one."""

    head: str
    line: str
    node_rank: int
    ranks: list[RankRecord]
    last_verdict: str | None = None
    exit_code: int = 1

    def to_json(self) -> HeadLostDoc:
        return {"head": self.head, "line": self.line, "node_rank": self.node_rank, "exit_code": self.exit_code,
                "last_verdict": self.last_verdict, "ranks": [rank_state(r) for r in self.ranks]}


def rank_state(rec: RankRecord) -> RankStateDoc:
    """A rank's record in words: its step, phase, the collective it is in, how it ended."""
    out: RankStateDoc = {"rank": rec.rank, "step": rec.step, "phase": rec.phase, "at": rec.where}
    if rec.coll:
        out["collective"] = {"op": rec.coll[0], "group": rec.coll[1], "seq": rec.coll[2]}
    if rec.exit:
        out["exit_code"], out["exception"] = rec.exit[0], rec.exit[1]
    return out


def rank_line(rec: RankRecord) -> str:
    """One rank's state for the console line: ``rank 2: step 57, in allreduce #113`` or ``rank 3: exited 1 ...``."""
    where = f"step {rec.step}" if rec.step is not None else "no heartbeat"
    if rec.exit:
        code, exc = rec.exit[0], rec.exit[1]
        head = str(exc).strip().splitlines()[-1][:120] if exc else ""
        return f"rank {rec.rank}: {where}, ended ({'exit ' + str(code) if code is not None else 'no status'})" + \
            (f": {head}" if head else "")
    if rec.coll:
        return f"rank {rec.rank}: {where}, in {rec.coll[0]} #{rec.coll[2]}"
    return f"rank {rec.rank}: {where}, {rec.phase or 'running'}"

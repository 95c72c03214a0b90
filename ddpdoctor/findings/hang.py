"""Hang diagnosis: which rank is the culprit, from heartbeats (pure functions). A rank's position, the culprit
rules, and the findings of RUN/hang.json and of the monitor's long stalls; how ranks crashed is findings/crash.py.

Findings: ``hang`` (built by findings/failure.py), ``collective-mismatch``, ``long-stall`` (docs/findings.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from ddpdoctor.findings.failure import hang_finding
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.records import (
    Beat,
    CollectiveState,
    HangDiagnosisDoc,
    HangDoc,
    PositionDoc,
    RankExitDoc,
    StallDoc,
    WaitedCollective,
)

DDP_BUCKETS = "allreduce (DDP gradient buckets)"

@dataclass
class RankPosition:
    """Where one rank stood when the hang was detected."""

    rank: int
    state: str  # "in-collective", "outside-collective", "exited", "no-heartbeat"
    phase: str | None = None
    step: int | None = None
    op: str | None = None
    group: str | None = None
    seq: int | None = None
    sizes: list[list[int]] = field(default_factory=list)
    call_site: str | None = None
    exit_code: int | None = None


@dataclass
class HangDiagnosis:
    kind: str  # "rank-exited", "outside-collective", "seq-behind", "mismatch", "unknown"
    stalled_ranks: list[int]
    culprit_ranks: list[int]
    collective: WaitedCollective | None
    positions: dict[int, RankPosition]
    reason: str
    differs: list[str] = field(default_factory=list)  # for a mismatch: "op", "sizes", "group"

    def to_json(self) -> HangDiagnosisDoc:
        # Field by field, not asdict(self): that deep-copies every rank's position once more (3 s at 32,768 ranks).
        # In the dataclass's field order, as hang.json has always had it.
        return {"kind": self.kind, "stalled_ranks": list(self.stalled_ranks), "culprit_ranks": list(self.culprit_ranks),
                "collective": WaitedCollective(**self.collective) if self.collective is not None else None,
                "positions": {str(r): _position_json(p) for r, p in self.positions.items()},
                "reason": self.reason, "differs": list(self.differs)}


def _position_json(p: RankPosition) -> PositionDoc:
    return {"rank": p.rank, "state": p.state, "phase": p.phase, "step": p.step, "op": p.op, "group": p.group,
            "seq": p.seq, "sizes": [list(s) for s in p.sizes], "call_site": p.call_site, "exit_code": p.exit_code}


def position(rank: int, beat: Beat | None, exit_info: RankExitDoc | None) -> RankPosition:
    """One rank's position from its last heartbeat (and its exit message, when it ended)."""
    if exit_info is not None:
        b: Beat = beat or {}
        last: CollectiveState = b.get("last_collective") or {}
        return RankPosition(rank, "exited", phase=b.get("phase"), step=exit_info.get("steps_completed"),
                            call_site=exit_info.get("exit_site") or last.get("call_site") or b.get("where"),
                            exit_code=exit_info.get("exit_code"))
    if beat is None:
        return RankPosition(rank, "no-heartbeat")
    coll = beat.get("collective")
    if coll:
        return RankPosition(rank, "in-collective", beat.get("phase"), beat.get("step"), coll.get("op"),
                            coll.get("group"), coll.get("seq"), coll.get("sizes") or [], coll.get("call_site"))
    bw = beat.get("backward")
    if bw and beat.get("phase") == "backward":
        # Stalled inside backward(): DDP's reducer waits for its bucket all-reduces there.
        return RankPosition(rank, "in-collective", "backward", beat.get("step"), DDP_BUCKETS, bw.get("group"),
                            bw.get("seq"), [], bw.get("call_site"))
    return RankPosition(rank, "outside-collective", beat.get("phase"), beat.get("step"), call_site=beat.get("where"))


def _key(p: RankPosition) -> tuple[str | None, str | None, list[list[int]] | None]:
    return (p.op, p.group, [list(s) for s in p.sizes] if p.op != DDP_BUCKETS else None)


def diagnose_hang(positions: dict[int, RankPosition], stalled: list[int]) -> HangDiagnosis:
    """Name the culprit: a rank that left, a rank outside any collective while others wait in one,
    the rank(s) behind on the group's collective count, or ranks in different collectives (a mismatch)."""
    inside = {r: p for r, p in positions.items() if p.state == "in-collective"}
    waiting_on = _collective_of(list(inside.values()))

    def diag(kind: str, culprits: list[int], reason: str, differs: list[str] | None = None,
             coll: WaitedCollective | None = waiting_on) -> HangDiagnosis:
        return HangDiagnosis(kind, sorted(stalled), sorted(culprits), coll, positions, reason, differs or [])

    gone = sorted(r for r, p in positions.items() if p.state in ("exited", "no-heartbeat"))
    if gone and inside:
        return diag("rank-exited", gone, f"rank(s) {gone} left (or never reported) while rank(s) {sorted(inside)} "
                    f"wait in {_describe(waiting_on)}")
    outside = sorted(r for r, p in positions.items() if p.state == "outside-collective")
    if outside and inside:
        return diag("outside-collective", outside, f"rank(s) {outside} are outside any collective while rank(s) "
                    f"{sorted(inside)} wait in {_describe(waiting_on)}")
    if inside and len(inside) == len(positions):
        by_group: dict[str | None, dict[int, RankPosition]] = {}
        for r, p in inside.items():
            by_group.setdefault(p.group, {})[r] = p
        for ranks in by_group.values():
            seqs = {p.seq for p in ranks.values() if p.seq is not None}
            if len(seqs) > 1:
                low = min(seqs)
                behind = sorted(r for r, p in ranks.items() if p.seq == low)
                ahead = [p for p in ranks.values() if p.seq != low]
                coll = _collective_of(ahead)
                return diag("seq-behind", behind, f"rank(s) {behind} are at collective #{low} on their group; the others "
                            f"are in {_describe(coll)}: rank(s) {behind} never launched it", coll=coll)
        keys = Counter(repr(_key(p)) for p in inside.values())
        if len(keys) > 1:
            common, n = keys.most_common(1)[0]
            minority = sorted(r for r, p in inside.items() if repr(_key(p)) != common)
            culprits = minority if n > len(inside) - n else sorted(inside)
            in_ddp = {r for r, p in inside.items() if p.op == DDP_BUCKETS}
            if in_ddp and len(in_ddp) < len(inside):
                # The ranks still in DDP's per-step all-reduce are where training should be; the others
                # left the loop early (fewer batches) or called an extra collective.
                culprits = sorted(set(inside) - in_ddp)
            waiting_on = _collective_of([p for r, p in inside.items() if r not in culprits]) or waiting_on
            ps = list(inside.values())
            differs = [f for f in ("op", "group", "sizes") if len({repr(getattr(p, f)) for p in ps}) > 1]
            return diag("mismatch", culprits, "ranks are in different collectives at the same point: "
                        + ", ".join(f"rank {r}: {_describe_position(p)}" for r, p in sorted(inside.items())),
                        differs, coll=waiting_on)
    return diag("unknown", [], "every rank is in the same state; no culprit can be told apart "
                "(a slow or broken network, a deadlock in the script, or a collective every rank is waiting in)")


def _collective_of(ps: list[RankPosition]) -> WaitedCollective | None:
    if not ps:
        return None
    p = max(ps, key=lambda p: (p.seq or 0))
    return {"op": p.op, "seq": p.seq, "group": p.group}


def _describe(c: WaitedCollective | None) -> str:
    if not c:
        return "a collective"
    seq = f" #{c['seq']}" if c.get("seq") is not None else ""
    return f"{c.get('op')}{seq} on {c.get('group')}"


def _describe_position(p: RankPosition) -> str:
    seq = f" #{p.seq}" if p.seq is not None else ""
    sizes = f" sizes {p.sizes}" if p.sizes else ""
    return f"{p.op}{seq} on {p.group}{sizes}"


# -- findings ------------------------------------------------------------------------------------------
HANG_ADVICE = {
    "rank-exited": "The rank(s) that left ran fewer collectives than the others: give every rank the same number of "
                   "batches (DistributedSampler(drop_last=True), or the join() context manager for uneven inputs).",
    "outside-collective": "Look at the culprit's stack: it is stuck outside torch.distributed (data loading, I/O, "
                          "a lock, an infinite loop); the others wait for it in the collective.",
    "seq-behind": "The culprit never called the collective the others are in: look for a collective under a "
                  "rank-dependent condition (if rank == 0: ...) or an early exit from the loop.",
    "mismatch": "Every rank must call the same collectives in the same order with the same shapes; the call "
                "sites show where they diverge. A rank in another collective while the rest are in DDP's "
                "gradient all-reduce either called an extra collective (under a rank condition) or left the "
                "training loop early (fewer batches: use DistributedSampler(drop_last=True) or DDP's join()).",
    "lost-node": "A node's ddpdoctor stopped publishing its ranks' state (its host died, its launcher was killed, "
                 "or the network to the head failed): read that node's scheduler and system logs (OOM killer, "
                 "preemption, node failure).",
    "unknown": "Compare the stacks; rerun with --debug (TORCH_DISTRIBUTED_DEBUG=DETAIL) to check collective "
               "fingerprints, and check the network (NCCL_DEBUG=INFO, `ddpdoctor topo`).",
}


def hang_findings(hang: HangDoc, debug: bool = False) -> list[Finding]:
    """``hang`` is RUN/hang.json as the monitor wrote it."""
    d = hang["diagnosis"]
    positions: dict[str, PositionDoc] = d.get("positions", {})
    call_sites = {r: p.get("call_site") for r, p in positions.items()}
    stacks = {str(r): s for r, s in hang.get("stacks", {}).items()}
    advice = HANG_ADVICE.get(d["kind"], HANG_ADVICE["unknown"])
    if not debug:
        advice += " Rerun with `ddpdoctor run --debug` for TORCH_DISTRIBUTED_DEBUG=DETAIL's collective checks."
    out = [hang_finding(
        ("No first step within the start-up timeout: " if hang.get("in_startup") else "Job hung: ") + d["reason"],
        d["culprit_ranks"] or d["stalled_ranks"], advice,
        stalled_ranks=d["stalled_ranks"], culprit_ranks=d["culprit_ranks"],
        collective=d.get("collective"), call_sites=call_sites, stacks=stacks,
        detected_after_s=hang.get("detected_after_s"), reported_after_s=hang.get("reported_after_s"),
        hang_timeout_s=hang.get("hang_timeout_s"), kind=d["kind"],
    )]
    if d["kind"] == "mismatch":
        out.append(mismatch_finding(
            {int(r): _at(p) for r, p in positions.items() if p.get("state") == "in-collective"}, d.get("differs", []),
            debug))
    return out


def _at(p: PositionDoc) -> CollectiveState:
    """A rank's position in hang.json as the collective it is in (the keys a mismatch's evidence shows)."""
    return {"op": p.get("op"), "group": p.get("group"), "seq": p.get("seq"), "sizes": p.get("sizes"),
            "call_site": p.get("call_site")}


class GlooSizes(TypedDict):
    """Gloo's "Received data size doesn't match" numbers, for a mismatch's evidence."""

    rank: int
    received_bytes: int
    expected_bytes: int


def mismatch_finding(colls: Mapping[int, CollectiveState], differs: list[str], debug: bool,
                      gloo_detail: GlooSizes | None = None) -> Finding:
    advice = HANG_ADVICE["mismatch"]
    if not debug:
        advice += " `ddpdoctor run --debug` makes torch check each collective's fingerprint."
    return Finding(
        "collective-mismatch", Severity.ERROR,
        "Ranks called different collectives: " + ", ".join(
            f"rank {r} {c.get('op')} {c.get('sizes') or ''} at {c.get('call_site')}" for r, c in sorted(colls.items())),
        ranks=sorted(colls),
        evidence={
            "ranks": sorted(colls), "differs": differs,
            "collectives": {str(r): {k: c.get(k) for k in ("op", "group", "seq", "sizes")} for r, c in colls.items()},
            "call_sites": {str(r): c.get("call_site") for r, c in colls.items()},
            **({"gloo_sizes": gloo_detail} if gloo_detail else {}),
        },
        advice=advice,
    )


def stall_findings(stalls: list[StallDoc]) -> list[Finding]:
    """``long-stall`` (warning): a rank that spent longer than the hang timeout outside any collective while still
    working (CPU, I/O or a moving stack), so the monitor kept watching instead of calling it a hang."""
    out = []
    for st in stalls:
        if not isinstance(st, dict) or not isinstance(st.get("rank"), int):
            continue
        secs = st.get("stalled_s")
        out.append(Finding(
            "long-stall", Severity.WARNING,
            f"Rank {st['rank']} spent {secs} s in step {st.get('step')} outside any collective, still working "
            f"(at {st.get('call_site')}); the other ranks waited for it",
            ranks=[st["rank"]],
            evidence={k: st.get(k) for k in ("rank", "step", "phase", "call_site", "stalled_s", "stack")},
            advice="A long checkpoint or evaluation on one rank makes every other rank wait. If it is expected, "
                   "nothing is wrong; to have ddpdoctor call it a hang after N seconds whatever the rank does, "
                   "pass --hang-timeout N.",
        ))
    return out

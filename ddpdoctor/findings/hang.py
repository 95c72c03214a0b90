"""Hang diagnosis: which rank is the culprit, from heartbeats (pure functions). A rank's position, the culprit
rules, and the findings of RUN/hang.json and of the monitor's long stalls; how ranks crashed is findings/crash.py.

Findings: ``hang`` (built by findings/failure.py), ``collective-mismatch``, ``long-stall`` (docs/findings.md)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from ddpdoctor.findings.failure import hang_finding
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.records import (
    WAIT_OPS,
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
    unit: str | None = None  # the FSDP2 unit whose collective it waits in
    # Completed steps when its training DataLoader raised StopIteration, if it drew no batch since
    # (probes/data_position.py): positive evidence that it left its training loop because its data ended.
    data_dry: int | None = None


@dataclass
class HangDiagnosis:
    kind: str  # "rank-exited", "loader-exhausted", "outside-collective", "seq-behind", "mismatch", "unknown"
    stalled_ranks: list[int]
    culprit_ranks: list[int]
    collective: WaitedCollective | None
    positions: dict[int, RankPosition]
    reason: str
    differs: list[str] = field(default_factory=list)  # for a mismatch: "op", "sizes", "group"
    # Which sources put each named rank where the verdict puts it (heartbeat, flight-recorder, stack): reconcile().
    sources: dict[int, list[str]] = field(default_factory=dict)

    def to_json(self) -> HangDiagnosisDoc:
        # Field by field, not asdict(self): that deep-copies every rank's position once more (3 s at 32,768 ranks).
        # In the dataclass's field order, as hang.json has always had it.
        out: HangDiagnosisDoc = {
            "kind": self.kind, "stalled_ranks": list(self.stalled_ranks), "culprit_ranks": list(self.culprit_ranks),
            "collective": WaitedCollective(**self.collective) if self.collective is not None else None,
            "positions": {str(r): _position_json(p) for r, p in self.positions.items()},
            "reason": self.reason, "differs": list(self.differs)}
        if self.sources:
            out["sources"] = {str(r): list(v) for r, v in sorted(self.sources.items())}
        return out


def _position_json(p: RankPosition) -> PositionDoc:
    out: PositionDoc = {"rank": p.rank, "state": p.state, "phase": p.phase, "step": p.step, "op": p.op,
                        "group": p.group, "seq": p.seq, "sizes": [list(s) for s in p.sizes], "call_site": p.call_site,
                        "exit_code": p.exit_code}
    if p.unit:
        out["unit"] = p.unit
    if p.data_dry is not None:
        out["data_dry"] = p.data_dry
    return out


def position(rank: int, beat: Beat | None, exit_info: RankExitDoc | None, ddp: bool = True) -> RankPosition:
    """One rank's position from its last heartbeat (and its exit message, when it ended). ``ddp``: the job built a
    DDP module (or nobody knows): a rank in backward() with no collective named waits in DDP's bucket all-reduce;
    without DDP (FSDP2, whose waits the collective source names) it is computing there."""
    p = _position(rank, beat, exit_info, ddp)
    dry = beat.get("data_dry") if beat is not None else None
    if type(dry) is int:
        p.data_dry = dry
    return p


def _position(rank: int, beat: Beat | None, exit_info: RankExitDoc | None, ddp: bool) -> RankPosition:
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
                            coll.get("group"), coll.get("seq"), coll.get("sizes") or [], coll.get("call_site"),
                            unit=coll.get("unit"))
    bw = beat.get("backward")
    if bw and beat.get("phase") == "backward" and ddp:
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
        dry = [r for r in gone if _ran_dry(positions[r])]
        return diag("rank-exited", gone, f"rank(s) {gone} left (or never reported) while rank(s) {sorted(inside)} "
                    f"wait in {_describe(waiting_on)}" + (f"; rank(s) {dry} left after their training DataLoader "
                                                          "ran dry (StopIteration)" if dry else ""))
    exhausted = _loader_exhausted(positions, inside)
    if exhausted is not None:
        return diag(*exhausted, coll=_collective_of([p for r, p in inside.items() if r not in exhausted[1]]))
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
            parted = _fsdp_parted(inside) if n == len(inside) - n else None
            if parted is not None:
                culprits = parted
            waiting_on = _collective_of([p for r, p in inside.items() if r not in culprits]) or waiting_on
            ps = list(inside.values())
            differs = [f for f in ("op", "group", "sizes") if len({repr(getattr(p, f)) for p in ps}) > 1]
            if _units_differ(inside):
                return diag("mismatch", culprits, _parted_reason(inside, culprits, parted is not None), differs,
                            coll=waiting_on)
            if in_ddp and _out_of_data(inside, culprits, in_ddp):
                step = inside[culprits[0]].step
                # Said as a possibility, not as the kind: an extra barrier at the top of the loop looks the same
                # from here (tests/e2e/test_multinode.py); only the loader's own StopIteration would tell them apart.
                return diag("mismatch", culprits, f"rank(s) {culprits} left the training loop early or called an "
                            f"extra barrier: after asking for a batch (phase data) at step {step} they entered "
                            + ", ".join(sorted({_describe_position(inside[r]) for r in culprits}))
                            + f" instead of the step's forward, while rank(s) {sorted(in_ddp)} are in that step's "
                            f"{DDP_BUCKETS}: either their data ran out (a shorter shard or loader) or a barrier runs "
                            "under a rank condition", differs, coll=waiting_on)
            return diag("mismatch", culprits, "ranks are in different collectives at the same point: "
                        + ", ".join(f"rank {r}: {_describe_position(p)}" for r, p in sorted(inside.items())),
                        differs, coll=waiting_on)
    return diag("unknown", [], "every rank is in the same state; no culprit can be told apart "
                "(a slow or broken network, a deadlock in the script, or a collective every rank is waiting in)")


def _ran_dry(p: RankPosition) -> bool:
    return p.data_dry is not None and p.data_dry == p.step


def _loader_exhausted(positions: dict[int, RankPosition], inside: dict[int, RankPosition]
                      ) -> tuple[str, list[int], str] | None:
    """Some live ranks' training DataLoader ran dry (StopIteration, at the step they are in, no batch drawn since)
    while the others, whose loaders did not, wait in a collective: the dry ones left their training loop first (a
    shorter shard or loader). Grounded in the loader's own StopIteration, never in where a rank waits: an extra
    barrier at the top of the loop is not this (tests/e2e/test_multinode.py)."""
    dry = sorted(r for r, p in positions.items() if _ran_dry(p))
    rest = [r for r in positions if r not in dry]
    # The others' loaders did not run dry (none at an earlier step either: that could be a loader read again).
    if not dry or not rest or any(r not in inside or positions[r].data_dry is not None for r in rest):
        return None
    where = ", ".join(sorted({_describe_position(positions[r]) if positions[r].state == "in-collective"
                              else f"{positions[r].phase or 'its code'} outside any collective" for r in dry}))
    steps = sorted({positions[r].data_dry or 0 for r in dry})
    return ("loader-exhausted", dry, f"rank(s) {dry}: their training DataLoader ran dry (StopIteration) after step "
            f"{', '.join(map(str, steps))} and they left the training loop into {where}, while rank(s) {sorted(rest)}, "
            f"whose loaders still had data, wait in {_describe(_collective_of([inside[r] for r in rest]))}: a "
            "shorter data shard or loader on the first (split the data evenly: DistributedSampler, drop_last, or "
            "torch.distributed.algorithms.Join)")


# -- FSDP2: ranks that took another path through the units (saforem2/ezpz#242) -------------------------------------
_PASS = {"forward": 0, "backward": 1}


def _units_differ(inside: dict[int, RankPosition]) -> bool:
    """Every rank waits in an FSDP2 unit's collective (the collective source named it), and not all in the same."""
    units = {p.unit for p in inside.values()}
    return None not in units and len(units) > 1


def _program_point(p: RankPosition) -> tuple[int, int] | None:
    """Where in the job a rank's FSDP2 collective is: (step, forward 0 / backward 1); None when the phase says
    neither."""
    if p.step is None or p.phase not in _PASS:
        return None
    return p.step, _PASS[p.phase]


def _fsdp_parted(inside: dict[int, RankPosition]) -> list[int] | None:
    """On a tie (as many ranks on each side), ranks in FSDP2 units' collectives at the same collective number but at
    other points of the job: the ranks further on (a later step, or backward where the others are still in forward)
    went past the collectives the others wait in, so they skipped them (a unit frozen or skipped on those ranks).
    None when that cannot be told (no unit named, the same step and pass, a phase that is neither)."""
    if not _units_differ(inside):
        return None
    points = {r: _program_point(p) for r, p in inside.items()}
    known = {r: pt for r, pt in points.items() if pt is not None}
    if len(known) < len(points) or len(set(known.values())) < 2:
        return None
    last = max(known.values())
    return sorted(r for r, pt in known.items() if pt == last)


def _parted_reason(inside: dict[int, RankPosition], culprits: list[int], ordered: bool) -> str:
    """The reason of a mismatch in FSDP2 units' collectives: where the ranks parted, and which went on."""
    def where(p: RankPosition) -> str:
        return f"{p.unit} (step {p.step}, {p.phase}; {p.op} #{p.seq} on {p.group})"

    waiting = sorted(r for r in inside if r not in culprits)
    if ordered and waiting:
        w, c = inside[waiting[0]], inside[culprits[0]]
        return (f"the ranks parted at {where(w)}: rank(s) {waiting} wait in it while rank(s) {culprits} went on "
                f"to {where(c)} at the same collective number, without it: a unit skipped, frozen "
                "(requires_grad=False) or built differently on those ranks")
    return ("the ranks parted between FSDP2 units at the same collective number: "
            + ", ".join(f"rank {r}: {where(p)}" for r, p in sorted(inside.items()))
            + ": a unit skipped, frozen or built differently on some ranks")


def _out_of_data(inside: dict[int, RankPosition], culprits: list[int], in_ddp: set[int]) -> bool:
    """The culprits of a mismatch left the loop when their data ran out: each is in a barrier entered from the data
    phase (it asked its loader for a batch and went on to the end-of-epoch barrier, not to forward), at the step the
    ranks in DDP's all-reduce are in. Another collective from the data phase may as well be an extra collective at
    the top of the loop: not said to be this."""
    steps = {inside[r].step for r in in_ddp}
    return bool(culprits) and len(steps) == 1 and all(
        inside[r].op == "barrier" and inside[r].phase == "data" and inside[r].step in steps for r in culprits)


def _collective_of(ps: list[RankPosition]) -> WaitedCollective | None:
    if not ps:
        return None
    p = max(ps, key=lambda p: (p.seq or 0))
    out: WaitedCollective = {"op": p.op, "seq": p.seq, "group": p.group}
    if p.unit:
        out["unit"] = p.unit
    return out


def _describe(c: WaitedCollective | None) -> str:
    if not c:
        return "a collective"
    seq = f" #{c['seq']}" if c.get("seq") is not None else ""
    unit = f" ({c['unit']})" if c.get("unit") else ""
    return f"{c.get('op')}{seq} on {c.get('group')}{unit}"


def _describe_position(p: RankPosition) -> str:
    seq = f" #{p.seq}" if p.seq is not None else ""
    sizes = f" sizes {p.sizes}" if p.sizes else ""
    return f"{p.op}{seq} on {p.group}{sizes}"


# -- reconciling the sources (docs/hangs.md#reconcile) ------------------------------------------------------------
# A rank's main thread, read from its stack, is "collective" when its innermost frame (ddpdoctor's own left out) is
# in torch's distributed code, "outside" when it is anywhere else but backward (where DDP's reducer both computes and
# waits: the stack alone cannot tell), None when there is no stack.
_DIST_FILES = ("torch/distributed/", "torch/nn/parallel/distributed.py")
_NEUTRAL_FILES = ("torch/autograd/", "torch/_tensor.py")
_PYSPY_FRAME = re.compile(r"^\s+(\S.*?) \((.+?):(\d+)\)\s*$")
_TB_FRAME = re.compile(r'^\s+File "(.+?)", line (\d+)')


def _main_frames(stack: str) -> list[str]:
    """The files of the main thread's frames, innermost first (py-spy's dump, or the heartbeat's traceback dump)."""
    lines = stack.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and ('"MainThread"' in line or "(MainThread)" in line):
            body = []
            for nxt in lines[i + 1:]:
                if nxt.startswith(("Thread ", "Process ", "Current thread")):
                    break
                body.append(nxt)
            spy = [m.group(2) for m in map(_PYSPY_FRAME.match, body) if m]
            if spy:
                return spy
            return [m.group(1) for m in map(_TB_FRAME.match, body) if m][::-1]
    return []


def stack_state(stack: str | None) -> str | None:
    """"collective", "outside" or None (no stack, no main thread in it, or in backward) from one rank's stack."""
    if not stack:
        return None
    for f in _main_frames(stack):
        f = f.replace("\\", "/")
        if f.startswith("ddpdoctor/probes/") or "/ddpdoctor/probes/" in f:
            continue  # our own wrappers around the wait
        if any(d in f for d in _DIST_FILES):
            return "collective"
        if any(d in f for d in _NEUTRAL_FILES):
            return None
        return "outside"
    return None


@dataclass
class FlightView:
    """One rank's Flight Recorder dump at verdict time: per group the last completed sequence number and the first
    collective enqueued and not completed (with its entry's op and sizes)."""

    completed: dict[str, int]
    pending: dict[str, RankPosition]


def flight_view(rank: int, dump: object) -> FlightView | None:
    """The view of one rank's dump (torch's JSON as the heartbeat sent it); None when it has none."""
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return None
    completed: dict[str, int] = {}
    enqueued: dict[str, int] = {}
    first: dict[str, int] = {}
    for g, st in dump["pg_status"].items():
        if not isinstance(st, dict):
            continue
        try:
            done, enq = int(st.get("last_completed_collective", -1)), int(st.get("last_enqueued_collective", -1))
        except (TypeError, ValueError):
            continue
        completed[str(g)] = done
        enqueued[str(g)] = enq
        if enq > done:
            first[str(g)] = done + 1
    entries = dump.get("entries")
    by_seq: dict[tuple[str, object], dict[str, object]] = {}
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or e.get("is_p2p"):
            continue
        pg = e.get("process_group")
        by_seq[(str(pg[0]) if isinstance(pg, list) and pg else "", e.get("collective_seq_id"))] = e
    named: dict[str, dict[str, object]] = {}
    for name in list(first):
        # gloo marks a group's last completed collective lazily (its backend thread): entries the dump already
        # says are retired completed, so the first pending one is the first not retired.
        seq = first[name]
        while (e := by_seq.get((name, seq))) is not None and e.get("retired") is True:
            seq += 1
        completed[name] = seq - 1
        if e is None and seq > enqueued[name]:
            del first[name]  # every enqueued one is retired: nothing pending
            continue
        first[name] = seq
        if e is not None:
            named[name] = e
    default = _default_name(dump)
    pending: dict[str, RankPosition] = {}
    for g, seq in first.items():
        e = named.get(g, {})
        op = str(e.get("profiling_name") or "collective")
        sizes = e.get("input_sizes")
        label = "default_pg" if g == default else g
        pending[label] = RankPosition(rank, "in-collective", op=op.split(":", 1)[-1], group=label, seq=seq,
                                      sizes=[list(x) for x in sizes if isinstance(x, list)][:4]
                                      if isinstance(sizes, list) else [])
    return FlightView({("default_pg" if g == default else g): v for g, v in completed.items()}, pending)


def _default_name(dump: dict[str, object]) -> str | None:
    """The default group's name in a dump: the group whose entries say ``default_pg``, else "0" (torch names the
    default group "0")."""
    entries = dump.get("entries")
    for e in entries if isinstance(entries, list) else []:
        pg = e.get("process_group") if isinstance(e, dict) else None
        if isinstance(pg, list) and len(pg) > 1 and pg[1] == "default_pg":
            return str(pg[0])
    return "0"


def reconcile(d: HangDiagnosis, stacks: Mapping[int, str | None], dumps: Mapping[int, object]) -> HangDiagnosis:
    """The verdict from every source: the heartbeats (``d``, from the ranks' records), each rank's Flight Recorder
    dump and its stack, both collected when the hang was seen. A rank the heartbeats put outside any collective
    whose stack waits in torch's distributed code and whose Flight Recorder holds a collective enqueued and not
    completed is in that collective (a wait no wrapper saw); where every rank looks alike, the Flight Recorder's
    counts tell which rank never launched the collective the others wait in. The result says, per named rank,
    which sources agree with where it puts that rank."""
    views = {r: flight_view(r, dumps.get(r)) for r in d.positions}
    states = {r: stack_state(stacks.get(r)) for r in d.positions}
    pos = dict(d.positions)
    changed = False
    generic = set(WAIT_OPS.values())
    for r, p in d.positions.items():
        v, st = views[r], states[r]
        if p.state == "in-collective" and v is not None and p.group in v.pending and (
                p.op in generic or (p.seq is not None and (v.pending[p.group].seq or 0) > p.seq)):
            # A wait the heartbeat saw but had not named yet, or named from gloo's lazily updated counters (an
            # earlier number than the dump's first collective not retired): the dump names it.
            named = v.pending[p.group]
            op = named.op if p.op in generic else p.op
            pos[r] = RankPosition(r, "in-collective", p.phase, p.step, op, p.group, named.seq, named.sizes or p.sizes,
                                  p.call_site, unit=p.unit, data_dry=p.data_dry)
            changed = True
        elif p.state == "outside-collective" and st == "collective":
            wait = _pending_of(v)
            pos[r] = RankPosition(r, "in-collective", p.phase, p.step, wait.op if wait else "collective (stack)",
                                  wait.group if wait else None, wait.seq if wait else None,
                                  wait.sizes if wait else [], p.call_site, data_dry=p.data_dry)
            changed = True
    out = diagnose_hang(pos, d.stalled_ranks) if changed else d
    if out.kind == "unknown":
        behind = _behind(pos, views)
        if behind is not None:
            out = behind
    out.sources = _agreement(out, d.positions, views, states)
    if out.sources and out.culprit_ranks:
        agreed = sorted({s for r in out.culprit_ranks for s in out.sources.get(r, [])})
        out.reason += f" (sources that agree: {', '.join(agreed) or 'none'})"
    return out


def _pending_of(v: FlightView | None) -> RankPosition | None:
    if v is None or not v.pending:
        return None
    return v.pending.get("default_pg") or next(iter(v.pending.values()))


def _behind(pos: dict[int, RankPosition], views: dict[int, FlightView | None]) -> HangDiagnosis | None:
    """Every rank looks alike to the heartbeats: on a group where some ranks have a collective pending, the ranks
    whose Flight Recorder never enqueued it (their last completed number is below it, nothing pending) are behind."""
    waiting = {r: _pending_of(v) for r, v in views.items() if v is not None and _pending_of(v) is not None}
    if not waiting or len(waiting) == len(pos):
        return None
    w = max((p for p in waiting.values() if p is not None), key=lambda p: p.seq or 0)
    behind = sorted(r for r, v in views.items() if v is not None and r not in waiting
                    and v.completed.get(w.group or "", 1 << 62) < (w.seq or 0))
    if not behind:
        return None
    coll: WaitedCollective = {"op": w.op, "seq": w.seq, "group": w.group}
    newpos = dict(pos)
    for r, p in waiting.items():
        if p is not None and pos[r].state != "in-collective":
            newpos[r] = RankPosition(r, "in-collective", pos[r].phase, pos[r].step, p.op, p.group, p.seq, p.sizes,
                                     pos[r].call_site, data_dry=pos[r].data_dry)
    return HangDiagnosis("seq-behind", sorted(p for p in pos if pos[p].state != "exited"), behind, coll, newpos,
                         f"rank(s) {behind} never launched {_describe(coll)}, which rank(s) {sorted(waiting)} wait in "
                         f"(Flight Recorder: their last completed collective on {w.group} is below #{w.seq})")


def _agreement(d: HangDiagnosis, beats: dict[int, RankPosition], views: dict[int, FlightView | None],
               states: dict[int, str | None]) -> dict[int, list[str]]:
    """Per rank the verdict names (culprits and the ranks waiting): the sources that put it where the verdict does."""
    named = set(d.culprit_ranks) | {r for r, p in d.positions.items() if p.state == "in-collective"}
    waited = d.collective
    out: dict[int, list[str]] = {}
    for r in sorted(named):
        final = d.positions.get(r)
        if final is None or final.state in ("exited", "no-heartbeat"):
            continue
        inside = final.state == "in-collective"
        agree = []
        if beats.get(r) is not None and (beats[r].state == "in-collective") == inside:
            agree.append("heartbeat")
        v = views.get(r)
        if v is not None:
            if inside and v.pending:
                agree.append("flight-recorder")
            elif not inside and not v.pending:
                seq, grp = (waited["seq"], waited["group"]) if waited else (None, None)
                done = v.completed.get(str(grp)) if grp else None
                if seq is None or done is None or done < int(seq):
                    agree.append("flight-recorder")
        st = states.get(r)
        if st is not None and (st == "collective") == inside:
            agree.append("stack")
        out[r] = agree
    return out


# -- findings ------------------------------------------------------------------------------------------
HANG_ADVICE = {
    "rank-exited": "The rank(s) that left ran fewer collectives than the others: give every rank the same number of "
                   "batches (DistributedSampler(drop_last=True), or the join() context manager for uneven inputs).",
    "loader-exhausted": "The culprit's training DataLoader ran out of batches before the others' (its shard or loader "
                        "is shorter): give every rank as many batches (DistributedSampler(drop_last=True), an even "
                        "split), or let the ranks that run out join the others "
                        "(torch.distributed.algorithms.Join with DDP's join hook).",
    "outside-collective": "Look at the culprit's stack: it is stuck outside torch.distributed (data loading, I/O, "
                          "a lock, an infinite loop); the others wait for it in the collective.",
    "seq-behind": "The culprit never called the collective the others are in: look for a collective under a "
                  "rank-dependent condition (if rank == 0: ...) or an early exit from the loop.",
    "mismatch": "Every rank must call the same collectives in the same order with the same shapes; the call "
                "sites show where they diverge. A rank in another collective while the rest are in DDP's "
                "gradient all-reduce either called an extra collective (under a rank condition) or left the "
                "training loop early (fewer batches: use DistributedSampler(drop_last=True) or DDP's join()).",
    "teardown": "The rank's script returned but its process does not exit: Python waits for every thread that is "
                "not a daemon (and for atexit handlers). Its stack shows the thread: join it, stop it, or make it a "
                "daemon (threading.Thread(daemon=True)); torchrun waits for every rank's process.",
    "lost-node": "A node's ddpdoctor stopped publishing its ranks' state (its host died, its launcher was killed, "
                 "or the network to the head failed): read that node's scheduler and system logs (OOM killer, "
                 "preemption, node failure).",
    "unknown": "Compare the stacks; rerun with --debug (TORCH_DISTRIBUTED_DEBUG=DETAIL) to check collective "
               "fingerprints, and check the network (NCCL_DEBUG=INFO, `ddpdoctor topo`).",
}


FSDP_PARTED_ADVICE = (
    "Every rank must run the same fully_shard units in the same order every step: FSDP2 all-gathers a unit's "
    "parameters before its forward and backward and reduce-scatters its gradients after, so a unit one rank skips "
    "(a branch on rank-local data: an early exit, a mixture-of-experts route, a layer count that differs), or "
    "freezes there only (requires_grad=False: FSDP2 then skips its reduce-scatter), leaves the others waiting in "
    "that unit's collective. Take such decisions from a value every rank shares (all-reduce it first), freeze the "
    "same parameters on every rank, and run every unit on every rank (with a zero contribution where it is "
    "unused).")


def hang_findings(hang: HangDoc, debug: bool = False, aborted_mismatch: Finding | None = None) -> list[Finding]:
    """``hang`` is RUN/hang.json as the monitor wrote it. ``aborted_mismatch``: the collective-mismatch that
    findings/crash.py read from a gloo abort and whose culprits it told apart (evidence ``culprit_ranks``): the ranks
    that ended are the aborted rank and its peers' victims, not ranks that left, and the hang that follows is that
    mismatch's (docs/hangs.md#gloo-mismatch)."""
    d = hang["diagnosis"]
    positions: dict[str, PositionDoc] = d.get("positions", {})
    call_sites = {r: p.get("call_site") for r, p in positions.items()}
    stacks = {str(r): s for r, s in hang.get("stacks", {}).items()}
    kind, culprits, reason = d["kind"], d["culprit_ranks"], d["reason"]
    told = (aborted_mismatch.evidence.get("culprit_ranks") if aborted_mismatch is not None else None)
    if kind == "rank-exited" and isinstance(told, list) and told:
        ended = sorted(int(r) for r, p in positions.items() if p.get("state") in ("exited", "no-heartbeat"))
        waiting = sorted(int(r) for r, p in positions.items() if p.get("state") == "in-collective")
        kind, culprits = "mismatch", sorted(int(r) for r in told)
        reason = (f"a collective mismatch: rank(s) {culprits} ran another collective (gloo aborted a rank that "
                  f"received its bytes); rank(s) {ended} ended with that abort, rank(s) {waiting} still wait")
    advice = HANG_ADVICE.get(kind, HANG_ADVICE["unknown"])
    units = {p.get("unit") for p in positions.values() if p.get("state") == "in-collective"}
    if kind == "mismatch" and None not in units and len(units) > 1:
        advice = FSDP_PARTED_ADVICE
    if not debug:
        advice += " Rerun with `ddpdoctor run --debug` for TORCH_DISTRIBUTED_DEBUG=DETAIL's collective checks."
    out = [hang_finding(
        ("No first step within the start-up timeout: " if hang.get("in_startup") else "Job hung: ") + reason,
        culprits or d["stalled_ranks"], advice,
        stalled_ranks=d["stalled_ranks"], culprit_ranks=culprits,
        collective=d.get("collective"), call_sites=call_sites, stacks=stacks,
        detected_after_s=hang.get("detected_after_s"), reported_after_s=hang.get("reported_after_s"),
        hang_timeout_s=hang.get("hang_timeout_s"), kind=kind,
    )]
    if aborted_mismatch is not None and kind != d["kind"]:
        return out
    if d["kind"] == "mismatch":
        out.append(mismatch_finding(
            {int(r): _at(p) for r, p in positions.items() if p.get("state") == "in-collective"}, d.get("differs", []),
            debug))
    return out


def _at(p: PositionDoc) -> CollectiveState:
    """A rank's position in hang.json as the collective it is in (the keys a mismatch's evidence shows)."""
    out: CollectiveState = {"op": p.get("op"), "group": p.get("group"), "seq": p.get("seq"), "sizes": p.get("sizes"),
                            "call_site": p.get("call_site")}
    unit = p.get("unit")
    if unit:
        out["unit"] = unit
    return out


class GlooSizes(TypedDict):
    """Gloo's "Received data size doesn't match" numbers, for a mismatch's evidence."""

    rank: int
    received_bytes: int
    expected_bytes: int


class AbortedRank(TypedDict):
    """The rank gloo aborted on a mismatch (the receiver of the odd bytes) and its exception's first line."""

    rank: int
    exception: str


_WHY = {
    "skipped": "rank(s) {c} skipped the collective the others wait in (they ran it the step before, and are now in "
               "the next step's DDP gradient all-reduce)",
    "left-or-extra": "rank(s) {c} are in another collective while the others are in DDP's gradient all-reduce: "
                     "they left the training loop early (fewer batches) or called an extra collective",
    "odd-one-out": "rank(s) {c} run another collective than the other ranks",
    "sender": "rank(s) {c} sent the bytes rank {a} did not expect",
}


def _grouped(colls: Mapping[int, CollectiveState]) -> str:
    """"ranks 0, 1, 3 all_reduce [[1]] at x.py:9, rank 2 ...": ranks in the same collective said once (linear)."""
    groups: dict[str, list[int]] = {}
    for r, c in sorted(colls.items()):
        unit = f" in {c.get('unit')}" if c.get("unit") else ""
        op = c.get("op") or "a collective it did not name"
        groups.setdefault(f"{op} {c.get('sizes') or ''}{unit} at {c.get('call_site')}", []).append(r)
    return ", ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} {what}" for what, rs in groups.items())


def mismatch_finding(colls: Mapping[int, CollectiveState], differs: list[str], debug: bool,
                      gloo_detail: GlooSizes | None = None, culprits: list[int] | None = None,
                      why: str | None = None, aborted: AbortedRank | None = None) -> Finding:
    """``culprits`` (with ``why``, a key of _WHY): the ranks to blame when the evidence tells them apart (the
    finding's ranks then); ``aborted``: the rank gloo aborted, a victim when it is not a culprit."""
    advice = HANG_ADVICE["mismatch"]
    if not debug:
        advice += " `ddpdoctor run --debug` makes torch check each collective's fingerprint."
    message = "Ranks called different collectives: " + _grouped(colls)
    if culprits is not None:
        named = ", ".join(map(str, culprits))
        message = (f"Rank(s) {named} caused a collective mismatch: "
                   + _WHY.get(why or "", "").format(c=named, a=aborted["rank"] if aborted else "?")
                   + (f"; gloo aborted rank {aborted['rank']}, which received them" if aborted else "")
                   + ". " + message)
    return Finding(
        "collective-mismatch", Severity.ERROR, message,
        ranks=sorted(culprits) if culprits is not None else sorted(colls),
        evidence={
            "ranks": sorted(colls), "differs": differs,
            "collectives": {str(r): {k: c.get(k) for k in ("op", "group", "seq", "sizes", "unit") if k != "unit"
                                     or c.get(k)} for r, c in colls.items()},
            "call_sites": {str(r): c.get("call_site") for r, c in colls.items()},
            **({"gloo_sizes": gloo_detail} if gloo_detail else {}),
            **({"culprit_ranks": sorted(culprits), "why": why} if culprits is not None else {}),
            **({"aborted": aborted} if aborted else {}),
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

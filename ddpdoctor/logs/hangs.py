"""The `hang` finding from logs: NCCL watchdog timeouts, gloo timeouts, monitoredBarrier and Flight Recorder dumps.

Each source gives a HangAnalysis; the strongest one (Flight Recorder > NCCL watchdog > monitoredBarrier > gloo
timeouts) becomes the finding, with stalled ranks merged from all of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from ddpdoctor.logs.events import (
    GlooTimeout,
    MonitoredBarrierFailure,
    RankException,
    RankHangState,
    WatchdogTimeout,
    WatchdogWorkState,
)
from ddpdoctor.logs.flight_recorder import FrGroupState


class Diverged(TypedDict):
    """Every rank inside the same collective #seq, some (``waiting``) with nothing enqueued after it, the others
    (``ahead``) gone on to #ahead_to; ``op``: the waiting ranks' op."""

    seq: int
    waiting: list[int]
    ahead: list[int]
    ahead_to: int
    op: str | None

@dataclass
class HangAnalysis:
    source: str
    stalled: set[int]
    culprits: set[int]
    op: str | None
    seq: int | None
    group: str | None
    detected_after_s: float | None
    why: str
    per_rank: dict[int, RankHangState] = field(default_factory=dict)
    call_sites: dict[int, str] = field(default_factory=dict)
    mismatch: dict[int, RankHangState] | None = None  # ranks inside different collectives at the same seq
    # Every rank inside the same collective, some with nothing enqueued after it, others far ahead:
    # {"seq": S, "waiting": [...], "ahead": [...], "ahead_to": N, "op": the waiting ranks' op}
    diverged: Diverged | None = None


def _last_per_rank(events: list[Any]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for e in events:
        if e.rank is not None:
            out[e.rank] = e  # the last report of a rank is its latest state
    return out


def from_nccl_watchdog(timeouts: list[WatchdogTimeout], states: list[WatchdogWorkState],
                       known: set[int]) -> HangAnalysis | None:
    """Lowest last-enqueued sequence number = the rank that never launched the collective the others wait in."""
    if not timeouts and not states:
        return None
    by_timeout = _last_per_rank(timeouts)
    by_state = {r: s for r, s in _last_per_rank(states).items()}
    stalled = set(by_timeout) | set(by_state)
    per_rank: dict[int, RankHangState] = {}
    for r in sorted(stalled):
        t, s = by_timeout.get(r), by_state.get(r)
        per_rank[r] = {
            "timed_out_seq": t.seq if t else (s.failed_seq if s else None),
            "op": t.op if t else None,
            "last_enqueued": s.last_enqueued if s else None,
            "last_completed": s.last_completed if s else None,
            "ran_for_ms": t.ran_for_ms if t else None,
        }
    enq = {r: v["last_enqueued"] for r, v in per_rank.items() if v["last_enqueued"] is not None}
    failed = {r: v["timed_out_seq"] for r, v in per_rank.items() if v["timed_out_seq"] is not None}
    culprits: set[int] = set()
    diverged: Diverged | None = None
    inside = next(iter(set(failed.values()))) if len(set(failed.values())) == 1 else None
    if len(enq) >= 2 and len(set(enq.values())) > 1 and inside is not None and min(enq.values()) == inside \
            and set(enq) <= set(failed):
        # Every rank is inside collective #inside (it timed out there), so none "never launched" it: some enqueued
        # nothing after it (their host waits for its result), the others went on without waiting. Either the ranks
        # ran different collectives at #inside (the ahead ranks' op there tells), or the same one failed to complete
        # between them (the network): the lines at hand cannot say which, and no rank is to blame from them.
        ops = {r: v["op"] for r, v in per_rank.items() if v["op"]}
        waiting = {r for r, v in enq.items() if v == inside}
        wait_ops = {ops[r] for r in waiting if r in ops}
        waiting |= {r for r, v in per_rank.items() if v["last_enqueued"] is None and ops.get(r) in wait_ops}
        went = {r for r, v in enq.items() if v > inside}
        op = next(iter(wait_ops)) if len(wait_ops) == 1 else None
        diverged = {"seq": inside, "waiting": sorted(waiting), "ahead": sorted(went),
                    "ahead_to": max(enq.values()), "op": op}
        went_ops = {ops[r] for r in went if r in ops}
        why = (f"every rank that reported times out inside collective #{inside}: rank(s) {sorted(waiting)}"
               + (f" (in {op})" if op else "") + f" enqueued nothing after it, rank(s) {sorted(went)} went on to "
               f"#{max(enq.values())} without waiting for it"
               + ("" if went_ops else f"; which collective rank(s) {sorted(went)} ran at #{inside} is not in "
                  "these logs: another op than " + (op or "the waiting ranks'") + " is a collective mismatch, the "
                  "same op one that the network could not complete"))
    elif len(enq) >= 2 and len(set(enq.values())) > 1:
        low = min(enq.values())
        culprits = {r for r, v in enq.items() if v == low}
        why = (f"rank(s) {sorted(culprits)} last enqueued collective #{low}, the others got further "
               f"(up to #{max(enq.values())}): the lowest never launched the collective the others wait in")
    elif len(failed) >= 2 and len(set(failed.values())) > 1:
        low = min(failed.values())
        culprits = {r for r, v in failed.items() if v == low}
        why = (f"ranks time out in different collectives (#{min(failed.values())} .. #{max(failed.values())}): "
               f"rank(s) {sorted(culprits)} fell behind (uneven batches or a skipped collective)")
    else:
        culprits = known - stalled
        why = ("every rank that reported times out in the same collective; "
               + (f"rank(s) {sorted(culprits)} appear in the logs but never reported a timeout: they never entered it"
                  if culprits else "the rank that never entered it wrote nothing in these logs (look for a rank "
                  "missing from this list, a dead node, or a rank stuck outside torch.distributed)"))
    ahead = [r for r in sorted(stalled - culprits) if r in by_timeout] or sorted(by_timeout)
    ref = by_timeout[ahead[0]] if ahead else None
    ran = [t.ran_for_ms for t in by_timeout.values() if t.ran_for_ms is not None]
    tmo = [t.timeout_ms for t in by_timeout.values() if t.timeout_ms is not None]
    detected = max(ran) / 1000 if ran else (max(tmo) / 1000 if tmo else None)
    group = (ref.group if ref else None) or next((s.group for s in by_state.values() if s.group), None)
    analysis = HangAnalysis(
        "nccl-watchdog", stalled - culprits, culprits, ref.op if ref else None,
        ref.seq if ref else next(iter(failed.values()), None), group, detected, why, per_rank, diverged=diverged)
    # Same sequence number on every rank but a different op or size: they are in different collectives.
    same_seq = {r: t for r, t in by_timeout.items() if ref is not None and t.seq == ref.seq}
    if len(same_seq) > 1 and len({(t.op, t.numel_in) for t in same_seq.values()}) > 1:
        analysis.mismatch = {r: {"op": t.op, "seq": t.seq, "numel_in": t.numel_in} for r, t in sorted(same_seq.items())}
        # One rank (or a minority) waiting in another op than the rest is the odd one out: it took another branch.
        by_op: dict[Any, set[int]] = {}
        for r, t in same_seq.items():
            by_op.setdefault((t.op, t.numel_in), set()).add(r)
        smallest = min(by_op.values(), key=len)
        if len(by_op) == 2 and len(smallest) < len(same_seq) - len(smallest) and not analysis.culprits:
            odd = next(k for k, v in by_op.items() if v == smallest)
            analysis.culprits = set(smallest)
            analysis.stalled = set(same_seq) - smallest
            analysis.why = (f"rank(s) {sorted(smallest)} wait in {odd[0]} while the other {len(same_seq) - len(smallest)}"
                            " wait in another collective" + (f" at the same sequence number #{ref.seq}" if ref
                                                             and ref.seq is not None else "")
                            + ": they took a different path through the code")
    return analysis


def from_gloo_timeouts(timeouts: list[GlooTimeout], exceptions: dict[int, list[RankException]],
                       known: set[int], crashed: dict[int, str]) -> HangAnalysis | None:
    """Ranks whose gloo recv/send timed out are stalled; ranks that are known but never timed out are the culprits."""
    by_rank = _last_per_rank(timeouts)
    if not by_rank and not any(t.rank is None for t in timeouts):
        return None
    stalled = set(by_rank)
    # Without knowing which rank timed out, "the ranks that did not" would be every rank: name nobody.
    culprits = ((known - stalled) | (set(crashed) - stalled)) if stalled else set()
    ops: dict[int, RankHangState] = {}
    call_sites: dict[int, str] = {}
    for r in sorted(stalled):
        exc = _timeout_exception(exceptions.get(r, []))
        if exc is not None:
            frame = exc.user_frame()
            if frame:
                call_sites[r] = str(frame)
            ops[r] = {"op": exc.torch_distributed_call(), "call_site": str(frame) if frame else None}
    distinct = {v["op"] for v in ops.values() if v["op"]}
    op = next(iter(distinct)) if len(distinct) == 1 else None
    tmo = [t.timeout_ms for t in timeouts]
    if not stalled:
        why = "a rank timed out waiting for a peer, but the log does not say which rank (no rank prefix)"
    elif culprits:
        why = (f"rank(s) {sorted(stalled)} waited {max(tmo) / 1000:g} s for data from a peer; rank(s) "
               f"{sorted(culprits)} never timed out"
               + (f" ({'; '.join(f'rank {r} crashed: {crashed[r]}' for r in sorted(crashed) if r in culprits)})"
                  if set(crashed) & culprits else ": they never entered the collective"))
    else:
        why = ("every rank timed out waiting for the others: they are in different collectives (a skipped or extra "
               "collective on one rank) or all wait on a rank that is not in these logs")
    per_rank: dict[int, RankHangState] = {r: {"timeout_ms": by_rank[r].timeout_ms, **ops.get(r, {})}
                                           for r in sorted(stalled)}
    analysis = HangAnalysis("gloo-timeout", stalled, culprits, op, None, None, max(tmo) / 1000, why, per_rank,
                            call_sites)
    if len(distinct) > 1:
        analysis.mismatch = {r: v for r, v in ops.items() if v["op"]}
    return analysis


def _timeout_exception(excs: list[RankException]) -> RankException | None:
    for exc in excs:
        if "Timed out waiting" in exc.message or "monitoredBarrier" in exc.message:
            return exc
    return excs[0] if excs else None


def from_monitored_barrier(failures: list[MonitoredBarrierFailure],
                           exceptions: dict[int, list[RankException]]) -> HangAnalysis | None:
    """'Ranks 1 failed to pass monitoredBarrier in 20000 ms': those ranks never reached the collective."""
    if not failures:
        return None
    culprits = {r for f in failures for r in f.failed_ranks}
    stalled = {f.reporter for f in failures if f.reporter is not None} - culprits
    call_sites: dict[int, str] = {}
    op = None
    for r in sorted(stalled):
        exc = _timeout_exception(exceptions.get(r, []))
        if exc is not None:
            op = op or exc.torch_distributed_call()
            if exc.user_frame():
                call_sites[r] = str(exc.user_frame())
    tmo = [f.timeout_ms for f in failures if f.timeout_ms is not None]
    why = (f"rank(s) {sorted(culprits)} did not reach the monitored barrier that TORCH_DISTRIBUTED_DEBUG=DETAIL "
           f"puts before each collective within {max(tmo) / 1000 if tmo else '?'} s")
    return HangAnalysis("monitored-barrier", stalled, culprits, op or "monitored_barrier", None, None,
                        max(tmo) / 1000 if tmo else None, why, {}, call_sites)


def from_flight_recorder(dumps: dict[int, dict[str, FrGroupState]]) -> tuple[HangAnalysis | None, list[str]]:
    """Compare each group's last enqueued/completed collective across ranks' dumps."""
    notes: list[str] = []
    if len(dumps) < 2:
        if dumps:
            notes.append("only one rank's Flight Recorder dump: give every rank's dump to compare their progress")
        return None, notes
    groups = sorted({g for states in dumps.values() for g in states})
    for gid in groups:
        ranks = {r: states[gid] for r, states in dumps.items() if gid in states}
        if len(ranks) < 2:
            continue
        per_rank: dict[int, RankHangState] = {
            r: {"last_enqueued": s.last_enqueued, "last_started": s.last_started, "last_completed": s.last_completed,
                "last_enqueued_op": c.op if (c := s.collectives.get(s.last_enqueued)) else None,
                "last_enqueued_sizes": c.input_sizes if c else None}
            for r, s in sorted(ranks.items())}
        enq = {r: s.last_enqueued for r, s in ranks.items()}
        group = next(iter(ranks.values())).group
        if len(set(enq.values())) > 1:
            low, high = min(enq.values()), max(enq.values())
            culprits = {r for r, v in enq.items() if v == low}
            stalled = set(ranks) - culprits
            ref = next((ranks[r].collectives.get(low + 1) for r in sorted(stalled) if low + 1 in ranks[r].collectives),
                       None)
            sites = {r: c.call_site for r in stalled if (c := ranks[r].collectives.get(low + 1)) and c.call_site}
            why = (f"rank(s) {sorted(culprits)} last enqueued collective #{low} in group {group}; rank(s) "
                   f"{sorted(stalled)} enqueued up to #{high}: the lowest never launched #{low + 1}")
            return HangAnalysis("flight-recorder", stalled, culprits, ref.op if ref else None, low + 1, group, None,
                                why, per_rank, sites), notes
        inside = {r for r, s in ranks.items() if s.last_completed < s.last_enqueued}
        if inside and inside != set(ranks):
            culprits = set(ranks) - inside
            seq = max(enq.values())
            ref = ranks[min(inside)].collectives.get(seq)
            why = (f"rank(s) {sorted(inside)} are inside collective #{seq} of group {group}; rank(s) "
                   f"{sorted(culprits)} finished everything they enqueued and are outside any collective")
            return HangAnalysis("flight-recorder", inside, culprits, ref.op if ref else None, seq, group, None,
                                why, per_rank), notes
        if inside:
            seq = max(enq.values())
            colls = {r: ranks[r].collectives.get(seq) for r in ranks}
            kinds = {(c.op, str(c.input_sizes)) for c in colls.values() if c}
            analysis = HangAnalysis("flight-recorder", inside, set(), None, seq, group, None,
                                    f"every rank is inside collective #{seq} of group {group}", per_rank)
            if len(kinds) > 1:
                analysis.mismatch = {r: {"op": c.op, "seq": seq, "shapes": c.input_sizes} for r, c in colls.items()
                                     if c}
            return analysis, notes
    notes.append("Flight Recorder: every rank completed every collective it enqueued (no hang in these dumps)")
    return None, notes

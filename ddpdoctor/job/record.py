"""The one typed record of a rank, from its node's monitor to the job's rules: where it is, how old its step is,
whether its training thread is doing anything, how it ended; plus an optional small per-step summary (the ledger).

Versioned (``VERSION``; a node envelope carries it) and compact on the wire: short field names, defaults left out,
a few dozen bytes per rank per beat. Times are ages measured on the publishing node's own clock ("seconds since
..., as of publishing"): no two hosts' clocks are ever compared. docs/hangs.md describes every field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from ddpdoctor.findings.hang import DDP_BUCKETS
from ddpdoctor.rundir.records import Beat, RankExitDoc, StallDoc

VERSION = 2
MAX_SIZES = 4  # tensor shapes kept per collective: enough to tell a mismatch, bounded at any scale
MAX_TEXT = 300  # characters of an exception or call site kept per record
MAX_SUMMARY = 16  # entries of the per-step summary (the ledger's numbers)


class RankRecord(msgspec.Struct, omit_defaults=True, rename={
        "rank": "r", "step": "s", "phase": "p", "coll": "c", "sizes": "z", "where": "w", "age_s": "a",
        "beat_age_s": "l", "slowest_s": "m", "exit": "x", "idle_s": "i", "moved_s": "v", "exit_age_s": "e",
        "summary": "k", "data_dry": "d"}):
    """One rank's state. ``step`` None: no heartbeat yet. ``coll``: [op, group, seq, call site] of the collective
    it is in (DDP's bucket all-reduce during backward counts). ``age_s``: seconds since its current step (or the
    job) started. ``idle_s``: seconds since its training thread last used CPU, did I/O or moved its Python position
    (None: not measured). ``moved_s``: seconds since its position (step, phase, collective, backward entry) last
    changed. ``exit``: [exit code, exception head, steps completed(, exit site)] once it ended, ``exit_age_s`` how long ago.
    ``summary``: the last completed step's small numbers (name -> value; probes/ledger.py adds its own).
    ``data_dry``: the completed steps when its training DataLoader ran dry, while it has drawn no batch since."""

    rank: int
    step: int | None = None
    phase: str | None = None
    coll: list[Any] | None = None
    sizes: list[list[int]] | None = None
    where: str | None = None
    age_s: float = 0.0
    beat_age_s: float | None = None
    slowest_s: float | None = None
    exit: list[Any] | None = None
    idle_s: float | None = None
    moved_s: float | None = None
    exit_age_s: float | None = None
    summary: dict[str, float] | None = None
    data_dry: int | None = None


def cut(s: Any, n: int = MAX_TEXT) -> str | None:
    return None if s is None else str(s)[:n]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _age(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 2)


def record(rank: int, beat: Beat | None, exit_info: RankExitDoc | None, now: float,
           job_started: float, active_at: float | None = None, moved_at: float | None = None,
           exit_at: float | None = None) -> RankRecord:
    """One rank's record from its last heartbeat and exit message (as the node's monitor holds them) and the
    monitor's own observations (``active_at``: its training thread's last CPU, I/O or position change)."""
    rec = RankRecord(rank, idle_s=_age(now, active_at), moved_s=_age(now, moved_at), exit_age_s=_age(now, exit_at))
    b: Beat = beat or {}
    if beat is not None:
        rec.step = int(_num(b.get("step")) or 0)
        rec.phase = cut(b.get("phase"), 40)
        coll, bw = b.get("collective"), b.get("backward")
        if isinstance(coll, dict):
            rec.coll = [cut(coll.get("op"), 80), cut(coll.get("group"), 80), coll.get("seq"),
                        cut(coll.get("call_site"))]
            if coll.get("unit"):
                rec.coll.append(cut(coll.get("unit"), 160))  # the FSDP2 unit (and mesh dim) it belongs to
            sizes = coll.get("sizes")
            if isinstance(sizes, list) and sizes:
                rec.sizes = [[int(x) for x in s[:8] if isinstance(x, int)] for s in sizes[:MAX_SIZES]
                             if isinstance(s, list)]
        elif isinstance(bw, dict) and b.get("phase") == "backward":
            rec.coll = [DDP_BUCKETS, cut(bw.get("group"), 80), bw.get("seq"), cut(bw.get("call_site"))]
        last = b.get("last_collective")
        rec.where = cut(b.get("where") or (last.get("call_site") if isinstance(last, dict) else None))
        started = _num(b.get("step_started")) if rec.step else None
        rec.age_s = round(now - (started or job_started), 2)
        sent = _num(b.get("time"))
        if sent:
            rec.beat_age_s = round(max(0.0, now - sent), 2)
        slowest = _num(b.get("max_step_s"))
        if slowest:
            rec.slowest_s = round(slowest, 3)
        dry = b.get("data_dry")
        if type(dry) is int:
            rec.data_dry = dry
        summary = b.get("summary")
        if isinstance(summary, dict):
            rec.summary = {str(k)[:40]: float(v) for k, v in list(summary.items())[:MAX_SUMMARY]
                           if _num(v) is not None}
    else:
        rec.age_s = round(now - job_started, 2)
    if exit_info is not None:
        rec.exit = [exit_info.get("exit_code"), cut(exit_info.get("exception")), exit_info.get("steps_completed")]
        if exit_info.get("exit_site"):
            rec.exit.append(cut(exit_info.get("exit_site")))  # where it called sys.exit (the hang rules name it)
    return rec


@dataclass
class LongStall:
    """A long stall (docs/findings.md#hangs-long-stall): a rank busy outside any collective past the hang timeout
    while the others wait, watched on; its node's monitor keeps one per (rank, step) and adds its stack."""

    rank: int
    step: int
    phase: str | None
    call_site: str | None
    since: float  # when its step started (its node's clock)
    stack: str | None = None
    stalled_s: float = 0.0

    def to_json(self) -> StallDoc:
        return {"rank": self.rank, "step": self.step, "phase": self.phase, "call_site": self.call_site,
                "since": self.since, "stack": self.stack, "stalled_s": self.stalled_s}


_DECODER = msgspec.json.Decoder(list[RankRecord])
_ENCODER = msgspec.json.Encoder()


def decode(raw: Any) -> list[RankRecord]:
    """Records from a node's envelope (off the store): one JSON text parsed straight into records (the usual case,
    ~10x faster than plain data converted); what is not a valid record is dropped."""
    if isinstance(raw, str):
        try:
            return _DECODER.decode(raw)
        except msgspec.DecodeError:
            try:
                raw = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                return []
    if not isinstance(raw, list):
        return []
    out = []
    for item in raw:
        try:
            out.append(msgspec.convert(item, RankRecord))
        except (msgspec.ValidationError, TypeError):
            continue
    return out


def encode(records: list[RankRecord]) -> str:
    """The records as one JSON text for the envelope (the store seals and compresses the envelope)."""
    return _ENCODER.encode(records).decode()

"""Torch's Flight Recorder as the collective ledger's NCCL source: its JSON dump decoded into typed rows, and per
training step the device time the rank spent in collectives (docs/metrics.md#ledger-sources).

Pure: dump bytes and step windows in, typed rows and per-step figures out. What the fields mean, from torch 2.13's
c10d FlightRecorder (FlightRecorder.hpp / FlightRecorderDetail.hpp) and ProcessGroupNCCL::collective():
- ``time_created_ns``: host wall clock (CLOCK_REALTIME, as Python's time.time_ns) when the work was enqueued, on the
  thread that issued it: which step a collective belongs to;
- ``duration_ms``: CUDA-event time from the start event, recorded on the group's NCCL stream after that stream was
  made to wait for the rank's own compute (syncStream), to the end event after the kernel: from the moment the
  rank's data was ready to the collective's end, i.e. the rank's wait for its peers plus the transfer. Present only
  with timing on (TORCH_NCCL_ENABLE_TIMING=1 or ``pg._enable_collectives_timing()``) and once the watchdog retired
  the entry;
- ``time_discovered_started_ns`` / ``..._completed_ns``: when a host thread *noticed* the events (0 or null when not
  yet): late by up to the watchdog's poll period, so used only as "done", never as a time;
- gloo (2.13) records entries with no events: ``state`` stays "scheduled", no duration. Its completion is the host's
  blocked time (probes/ledger.py).

One group's collectives run in issue order on one NCCL stream, so their durations never overlap and add up to the
time its stream spent in collectives; collectives of different groups can overlap on the device and are then counted
once per group. Linear in entries: each finds its step by one binary search."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from ddpdoctor.jsontypes import JsonObject

# Flight Recorder dtype names -> bytes per element (c10's ScalarType names)
DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
               "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1}


class _Entry(msgspec.Struct):
    """The fields of one dump entry that the ledger reads (the rest is skipped unparsed)."""

    record_id: int = -1
    process_group: list[str] = []
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    is_p2p: bool = False
    profiling_name: str = ""
    time_created_ns: int = 0
    input_sizes: list[list[int]] = []
    input_dtypes: list[str] = []
    state: str = ""
    retired: bool = False
    duration_ms: float | None = None
    time_discovered_completed_ns: int | None = None


class _Dump(msgspec.Struct):
    entries: list[_Entry] = []


class Timing(msgspec.Struct):
    """The few fields of an entry that a step's device time needs, decoded straight from the dump (the ledger's
    thread reads the whole ring each time: ~1 us per entry, against ~15 for a full row)."""

    record_id: int = -1
    process_group: list[str] = []
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    is_p2p: bool = False
    time_created_ns: int = 0
    retired: bool = False
    duration_ms: float | None = None


class _TimingDump(msgspec.Struct):
    entries: list[Timing] = []


_DECODER = msgspec.json.Decoder(_Dump)
_TIMING_DECODER = msgspec.json.Decoder(_TimingDump)


@dataclass(frozen=True)
class Collective:
    """One Flight Recorder entry as a ledger row."""

    record_id: int
    group: str | None  # the group's name (process_group[0]); its description is process_group[1]
    desc: str | None
    seq: int  # collective_seq_id, or p2p_seq_id for point-to-point work
    p2p: bool
    op: str
    nbytes: int | None
    enqueued_ns: int
    state: str  # scheduled / started / completed
    retired: bool  # the backend is done with it: a duration missing now will never come
    duration_s: float | None
    noticed_done_ns: int | None = None  # time_discovered_completed_ns: when a host thread saw it done (late)
    sizes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()

    def to_json(self) -> JsonObject:
        return {"group": self.desc, "pg": self.group, "seq": self.seq, "p2p": self.p2p, "op": self.op,
                "sizes": [list(s) for s in self.sizes], "dtypes": list(self.dtypes), "bytes": self.nbytes,
                "enqueued_ns": self.enqueued_ns, "completed_ns": self.noticed_done_ns, "state": self.state,
                "duration_ms": round(self.duration_s * 1e3, 6) if self.duration_s is not None else None}


def decode(raw: bytes | str) -> list[Collective]:
    """The entries of a Flight Recorder JSON dump (probes/flight.dump_json), oldest first. Raises ValueError on a malformed dump."""
    try:
        dump = _DECODER.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a Flight Recorder JSON dump: {exc}") from None
    out = []
    for e in dump.entries:
        pg = e.process_group
        out.append(Collective(
            record_id=e.record_id, group=pg[0] if pg else None, desc=pg[1] if len(pg) > 1 else None,
            seq=e.p2p_seq_id if e.is_p2p else e.collective_seq_id, p2p=e.is_p2p, op=e.profiling_name,
            nbytes=nbytes(e.input_sizes, e.input_dtypes), enqueued_ns=e.time_created_ns, state=e.state,
            retired=e.retired, duration_s=e.duration_ms / 1e3 if e.duration_ms is not None else None,
            noticed_done_ns=e.time_discovered_completed_ns or None,
            sizes=tuple(tuple(s) for s in e.input_sizes), dtypes=tuple(e.input_dtypes),
        ))
    return out


def decode_timing(raw: bytes | str) -> list[Timing]:
    """What device_time needs of a dump's entries, oldest first. Raises ValueError on a malformed dump."""
    try:
        return _TIMING_DECODER.decode(raw).entries
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a Flight Recorder JSON dump: {exc}") from None


def nbytes(sizes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> int | None:
    """Bytes of a collective's inputs from the Flight Recorder's shapes and dtype names (None when unknown)."""
    if len(sizes) != len(dtypes):
        return None
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=True):
        size = DTYPE_BYTES.get(dtype)
        if size is None:
            return None
        n = 1
        for d in shape:
            n *= d
        total += n * size
    return total


@dataclass(frozen=True)
class StepTime:
    """A step's device time in collectives: ``seconds`` when every collective enqueued in the step has its
    duration; else ``pending`` (some are still running or not yet retired) or ``missing`` (why it never will be
    known: timing off, the entry fell out of the ring, the backend records no times)."""

    step: int
    seconds: float | None
    collectives: int
    pending: bool = False
    missing: str | None = None


def device_time(entries: Sequence[Timing], windows: Sequence[tuple[int, int, int]],
                known_from_ns: int = 0, newest_ns: int | None = None) -> list[StepTime]:
    """Per step window ``(step, start_ns, end_ns)`` (sorted, not overlapping), the device time in the collectives
    enqueued within it. ``known_from_ns``: the ring holds every entry enqueued since then (entries before it may
    have been overwritten), so a step that began earlier is ``missing``. ``newest_ns``: the newest entry's enqueue
    time (default: the newest given); a step with no collective is 0 s only when something was recorded after it
    ended (a gradient-accumulation step), else still ``pending`` (an empty or stale recorder proves nothing). One
    collective is counted once however many entries it has (the ops of a coalesced group share one sequence number;
    the group's entry is timed)."""
    if newest_ns is None:
        newest_ns = max((e.time_created_ns for e in entries), default=-1)
    starts = [w[1] for w in windows]
    # per step: (group, p2p, seq) -> (the longest duration among its entries, or None; some entry still running)
    per: list[dict[tuple[str, bool, int], tuple[float | None, bool]]] = [{} for _ in windows]
    for e in entries:
        i = bisect.bisect_right(starts, e.time_created_ns) - 1
        if i < 0 or e.time_created_ns >= windows[i][2]:
            continue  # before the first step, or after the last one ended
        key = (e.process_group[0] if e.process_group else "", e.is_p2p,
               e.p2p_seq_id if e.is_p2p else e.collective_seq_id)
        dur, running = per[i].get(key, (None, False))
        if e.duration_ms is not None:
            dur = e.duration_ms / 1e3 if dur is None else max(dur, e.duration_ms / 1e3)
        per[i][key] = (dur, running or (e.duration_ms is None and not e.retired))
    out = []
    for (step, start, end), colls in zip(windows, per, strict=True):
        if start < known_from_ns:
            out.append(StepTime(step, None, len(colls), missing="the step's collectives left the Flight Recorder's "
                                "ring before they were read (TORCH_FR_BUFFER_SIZE)"))
            continue
        if not colls and newest_ns < end:
            out.append(StepTime(step, None, 0, pending=True))
            continue
        total, pending, untimed = 0.0, False, 0
        for dur, running in colls.values():
            if dur is not None:
                total += dur
            elif running:
                pending = True  # not completed yet, or completed and not yet retired by the watchdog
            else:
                untimed += 1  # retired with no duration: never timed (timing off, gloo) or timed out
        if untimed:
            out.append(StepTime(step, None, len(colls), missing=f"{untimed} of the step's {len(colls)} collectives "
                                "carry no duration: NCCL timing is off (TORCH_NCCL_ENABLE_TIMING) or the backend "
                                "records none (gloo)"))
        elif pending:
            out.append(StepTime(step, None, len(colls), pending=True))
        else:
            out.append(StepTime(step, total, len(colls)))
    return out

"""A big trace read a range of events at a time, in this process: no more than one range's decoded events are held
at once (issue 40: `analyze` of a 200,000-step CPU trace held the 223 MB text, its 1.6 million decoded events and
the columns together, 2 GB). Each range is read (pread, or a slice of the decompressed buffer), decoded, reduced to
columns (scan.Part) and dropped before the next; only the columns stay.

Two passes over the ranges: the first decodes only the metadata events (which threads are gloo's: a CPU trace's
compute excludes them, and Kineto may name threads anywhere in the file), skipping every other event in the parser;
the second reduces. A CPU trace's compute ops, which the one-pass reader keeps as event objects until its columns
are built (trace.join_parts), become two float columns per range here.

The ranges are those of traces/split.py (cut at `},{`, each checked by decoding it as a whole JSON array of events).
Anything this reader does not take as the one-pass reader would (a range that does not decode, a GPU kernel, a
file that changed, no events) makes it answer None, and the one-pass reader reads the file: the same columns, the
same errors, the same notes."""

from __future__ import annotations

import functools
import operator
import os
import re
from array import array
from collections.abc import Callable, Iterator
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import numpy as np

from ddpdoctor.errors import BadInput
from ddpdoctor.traces.loader import (
    _EVENTS,
    _OTHERS,
    DECODE_ERRORS,
    Event,
    MEvent,
    OtherEvent,
    RawTrace,
    complete_events,
    decode_args,
    metadata_events,
)
from ddpdoctor.traces.ranges import (
    BufferSource,
    FileChanged,
    FileSource,
    Source,
    _boundary,
    _edges,
    _tagged_or_any,
)
from ddpdoctor.traces.scan import Part, bad_duration, compute_mask, scan_complete

if TYPE_CHECKING:
    from ddpdoctor.traces.trace import Trace

CHUNK_BYTES = 8 << 20  # one range: ~60,000 CPU events, ~25 MB decoded
MIN_CHUNKED_BYTES = 2 * CHUNK_BYTES  # below this the whole trace is read at once (no cut to plan)
T = TypeVar("T")
_TRIES = 8  # boundaries tried for one cut (a `},{` inside a name is not one)

# Pass one: metadata events decoded, 'X' events (nearly all) skipped by the parser like the other phases.
_SKIP_X = msgspec.defstruct("PhaseX", [], bases=(OtherEvent,), tag="X", gc=False, namespace={"ph": "X"})
_META_UNION: Any = functools.reduce(operator.or_, (MEvent, _SKIP_X, *_OTHERS))  # a union built at run time
_META = msgspec.json.Decoder(list[_META_UNION])
_TS, _DUR = attrgetter("ts"), attrgetter("dur")
_PHASE_M, _ESCAPE = re.compile(rb'"M"'), re.compile(rb"\\u")  # (one literal each: searched as fast as memchr)


def _range_bytes(src: Source, start: int, end: int) -> bytearray | memoryview:
    """The events of [start, end) as one JSON array: the separators before and after the range become the brackets,
    in a copy read straight into its buffer (a file), or in place and in a view (a decompressed buffer: the bytes
    are put back by _restore once the range is decoded); one copy of the range at most."""
    if isinstance(src, FileSource):
        buf = bytearray(end - start + 2)
        if os.preadv(src.fd, [buf], start - 1) != len(buf):
            raise FileChanged  # shorter than it was
        src.check()
        buf[0], buf[-1] = 0x5B, 0x5D  # '[' and ']'
        return buf
    data = src.data
    if isinstance(data, bytes):
        return memoryview(b"[" + memoryview(data)[start:end] + b"]")
    data[start - 1], data[end] = 0x5B, 0x5D
    return memoryview(data)[start - 1:end + 1]


def _restore(src: Source, start: int, end: int, before: int, after: int) -> None:
    if isinstance(src, BufferSource) and isinstance(src.data, bytearray):
        src.data[start - 1], src.data[end] = before, after


def _decoded(src: Source, start: int, end: int, decode: Callable[[Any], T]) -> T:
    """decode(the range as a JSON array), the source as it was afterwards."""
    data = src.data if isinstance(src, BufferSource) else b""
    before, after = (data[start - 1], data[end]) if data else (0, 0)
    try:
        return decode(_range_bytes(src, start, end))
    finally:
        if data:
            _restore(src, start, end, before, after)


def _metadata(buf: bytearray | memoryview) -> list[Event | MEvent]:
    """The metadata events of one range (every other event skipped where every phase is one of the format's). A
    range without the string "M" (a metadata event's phase) and without a \\u escape (one written escaped) holds
    none and is not decoded: most ranges of a trace, searched at the speed of memory. Such a range is not checked
    here (read_chunked checks every range again where a later one does not decode; the second pass decodes every
    range, and cuts again where one does not decode)."""
    if _PHASE_M.search(buf) is None and _ESCAPE.search(buf) is None:
        return []
    return _all_metadata(buf)


def _all_metadata(buf: bytearray | memoryview) -> list[Event | MEvent]:
    """The metadata events of one range, the range decoded (checked) whatever it holds."""
    try:
        return [e for e in _META.decode(buf) if type(e) is MEvent]
    except msgspec.ValidationError:
        return metadata_events(list(_EVENTS.decode(buf)))  # a phase outside the format: read as the reader of last resort


def _gloo_tids(metadata: list[Event | MEvent]) -> set[tuple[int | str, int | str]]:
    """As trace.build_trace: the threads a thread_name metadata event names pt_gloo_runloop."""
    out: set[tuple[int | str, int | str]] = set()
    for ev in metadata:
        if ev.name == "thread_name":
            label = decode_args(ev.args).name
            if isinstance(label, str) and "pt_gloo_runloop" in label:
                out.add((ev.pid, ev.tid))
    return out


def read_chunked(src: Source, path: Path, fallback_rank: int | None = None) -> Trace | None:
    """The trace read range by range (see the module's docstring); None where the one-pass reader must read it (a
    trace under MIN_CHUNKED_BYTES is read at once)."""
    if src.size < MIN_CHUNKED_BYTES:
        return None
    edges = _edges(src)
    if edges is None:
        return None
    lb, rb, doc = edges
    try:
        try:
            metadata = [m for found in _decoded_ranges(src, lb, rb, _metadata) for m in found]
        except _Unreadable:
            # A range skipped unchecked was cut inside a string: the next was read from there, and did not decode.
            # Every range checked, as the second pass does.
            metadata = [m for found in _decoded_ranges(src, lb, rb, _all_metadata) for m in found]
        parts = _reduce_all(src, lb, rb, _gloo_tids(metadata), str(path))
    except (*DECODE_ERRORS, _Unreadable, FileChanged, OSError):
        return None
    if parts is None:
        return None
    from ddpdoctor.traces.trace import join_parts  # numpy

    return join_parts(RawTrace(str(path), [], doc.distributedInfo, doc.host_name), parts, False, fallback_rank)


class _Unreadable(Exception):
    """A range that does not decode wherever it is cut: the one-pass reader reads the file."""


def _decoded_ranges(src: Source, lb: int, rb: int, decode: Callable[[Any], T]) -> Iterator[T]:
    """decode(each range) of the array [lb, rb], cut about every CHUNK_BYTES at a `},{`, in order. A `},{` inside a
    string or a nested array leaves a range that does not decode: the cut moves to the next one, up to _TRIES
    times (then _Unreadable)."""
    start = lb + 1
    while start < rb:
        at = start + CHUNK_BYTES
        for _ in range(_TRIES):
            b = _boundary(src, at, rb) if at < rb else None
            end, after = (b[0] + 1, b[1] - 1) if b is not None else (rb, rb)
            try:
                out = _decoded(src, start, end, decode)
                break
            except DECODE_ERRORS:
                if b is None:
                    raise _Unreadable from None
                at = b[0] + 1
        else:
            raise _Unreadable
        yield out
        start = after


def _reduce_all(src: Source, lb: int, rb: int, gloo_tids: set[tuple[int | str, int | str]],
                path: str) -> list[Part] | None:
    """Every range reduced as a CPU trace's; None where one holds a GPU kernel (a GPU trace: the one-pass reader
    decides), no range holds an event, or a compute op's bad duration needs the one-pass reader's order (FSDP)."""
    parts: list[Part] = []
    starts: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    first_bad: BadInput | None = None  # the first compute op with a bad duration, raised after every range
    for events in _decoded_ranges(src, lb, rb, _tagged_or_any):
        xs = complete_events(events)
        part = scan_complete(xs, len(events), False, gloo_tids, path, fsdp_filter=False)
        del events, xs
        if part.has_kernels:
            return None
        ops = part.cpu_compute or []
        part.cpu_compute = None
        # As trace._cpu_compute, a range at a time: the columns built in C, the same duration check.
        start = np.fromiter(map(_TS, ops), dtype=np.float64, count=len(ops))
        dur = np.fromiter(map(_DUR, ops), dtype=np.float64, count=len(ops))
        end = start + dur
        if first_bad is None:
            with np.errstate(invalid="ignore"):
                bad = ~((dur >= 0.0) & np.isfinite(end))
            if bad.any():
                try:
                    bad_duration(ops[int(np.argmax(bad))], path)
                except BadInput as exc:
                    first_bad = exc
        del ops
        starts.append(start)
        ends.append(end)
        parts.append(part)
    if not sum(p.n_events for p in parts):
        return None  # "trace has no events": the one-pass reader says it
    start, end = np.concatenate(starts), np.concatenate(ends)
    del starts, ends
    fsdp = [c for p in parts for c in p.fsdp]
    if fsdp:
        if first_bad is not None:
            return None  # whether that op counts depends on FSDP's ranges: the one-pass reader's order decides
        keep = np.array(compute_mask(start.tolist(), end.tolist(), fsdp), dtype=bool)
        start, end = start[keep], end[keep]
    if first_bad is not None:
        raise first_bad
    rows = array("d")
    rows.frombytes(np.column_stack((start, end, start)).tobytes())  # flat (start, end, launch) rows
    parts[0].compute = rows
    return parts


def read_buffer_chunked(data: bytes | bytearray, path: Path, fallback_rank: int | None = None) -> Trace | None:
    """read_chunked of a trace already in memory (a decompressed file)."""
    return read_chunked(BufferSource(data), path, fallback_rank)

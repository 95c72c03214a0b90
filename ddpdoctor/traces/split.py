"""One big GPU trace read on several cores: its traceEvents array cut into byte ranges at event boundaries, each range
decoded and reduced to columns (trace.scan) in a forked worker; only the columns come back, pickled through a pipe.

The cut is checked, not trusted: a range decodes as a list of events only when it starts and ends where the one-pass
parse would be between two events (a cut inside a string or a nested array leaves a range that is not a whole JSON
array), and the file's other fields are decoded from its head and tail around an empty array. Anything else (a
damaged file, a CPU trace, a cut that fails) is read by the one-pass path, which gives the same columns or the same
error. Each worker holds only its range's events: peak memory is the file's bytes plus one range's events."""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput
from ddpdoctor.traces.loader import (
    _DOC,
    _EVENTS,
    RawTrace,
    TraceDoc,
    load_raw,
    no_gc,
    raw_from_bytes,
    read_buffer,
)
from ddpdoctor.traces.trace import Part, Trace, build_trace, join_parts, scan

MIN_SPLIT_BYTES = 32 << 20  # below this, forking and pickling cost more than a core saves
_MAX_EDGE = 4 << 20  # the head (before the array) and tail (after it) are decoded as one small document
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN = re.compile(rb"\}\s*,\s*\{")  # between two events (or inside a string or a nested array: checked)
Buffer = bytes | bytearray  # the file's bytes, or a private (writable) copy of them
_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)


class Cut(NamedTuple):
    """Byte ranges [start, end) of the events, in order, and the metadata decoded around them."""

    ranges: list[tuple[int, int]]
    doc: TraceDoc


def _edges(data: Buffer) -> tuple[int, int, TraceDoc] | None:
    """(position of the array's '[', of its ']', the document without its events), when head and tail decode."""
    m = _KEY.search(data, 0, _MAX_EDGE)
    if m is None:
        return None
    lb = m.end() - 1
    # The head, closed right after the key, decodes only where the key is a field of the top-level object (not
    # inside a string or a nested object).
    try:
        _DOC.decode(data[:lb] + b"[]}")
    except _DECODE_ERRORS:
        return None
    rb = len(data)
    for _ in range(8):  # the last ']' whose tail completes the document (a ']' inside a tail string is skipped)
        rb = data.rfind(b"]", max(lb, len(data) - _MAX_EDGE), rb)
        if rb <= lb:
            return None
        tail = data[rb + 1:]
        if b'"traceEvents"' in tail:
            return None  # a second traceEvents field: the one-pass reader decides what that means
        try:
            doc = _DOC.decode(data[:lb] + b"[]" + tail)
        except _DECODE_ERRORS:
            continue
        return (lb, rb, doc) if not doc.traceEvents else None
    return None


def cut(data: Buffer, n: int) -> Cut | None:
    """The events' byte ranges, about equal, at most n; None when the document's shape is not the usual one."""
    edges = _edges(data)
    if edges is None:
        return None
    lb, rb, doc = edges
    return Cut(cut_at(data, lb, rb, [lb + 1 + (rb - lb - 1) * k // n for k in range(1, n)]), doc)


def cut_at(data: Buffer, lb: int, rb: int, targets: list[int]) -> list[tuple[int, int]]:
    """Ranges of the array data[lb:rb + 1] cut at the first `},{` after each target (in increasing order)."""
    ranges: list[tuple[int, int]] = []
    start = lb + 1
    for target in targets:
        if target <= start:
            continue
        m = _BETWEEN.search(data, target, rb)
        if m is None:
            break
        ranges.append((start, m.start() + 1))
        start = m.end() - 1
    ranges.append((start, rb))
    return ranges


def decode_range(data: Buffer, start: int, end: int) -> list:  # type: ignore[type-arg]
    """The events of one range (raises msgspec's errors where the range is not a whole run of events). A writable
    buffer (a private copy of the file) gets the brackets in place, in the byte before and the byte after the range
    (a separator or blank) and back: no copy of the range."""
    if isinstance(data, bytes):
        return _EVENTS.decode(b"[" + memoryview(data)[start:end] + b"]")
    before, after = data[start - 1], data[end]
    data[start - 1], data[end] = 0x5B, 0x5D  # '[' and ']'
    try:
        # The view is not released: the events' raw args point into it, and keep the buffer alive as they do.
        return _EVENTS.decode(memoryview(data)[start - 1:end + 1])
    finally:
        data[start - 1], data[end] = before, after


def _reduce(data: Buffer, start: int, end: int, path: str) -> Part | None:
    """One range's columns as a GPU trace's (they do not depend on the thread names: only a CPU trace's gloo
    threads do); None where the range does not decode or holds a damaged event."""
    try:
        return scan(decode_range(data, start, end), True, set(), path)
    except (*_DECODE_ERRORS, BadInput):
        return None


def _fork_map(fn: Callable[..., Part | None], jobs: list[tuple]) -> list[Part | None]:  # type: ignore[type-arg]
    """fn(*job) for every job, the first in this process and each other in a forked child (which sees the parent's
    memory, so the file's bytes are not copied); a child that dies answers None."""
    children: list[tuple[int, int]] = []  # (pid, read end of its pipe)
    unread: set[int] = set()
    try:
        for job in jobs[1:]:
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
                code = 1
                try:
                    os.close(r)
                    blob = pickle.dumps(fn(*job), protocol=pickle.HIGHEST_PROTOCOL)
                    with os.fdopen(w, "wb") as fh:
                        fh.write(blob)
                    code = 0
                finally:
                    os._exit(code)
            os.close(w)
            children.append((pid, r))
            unread.add(r)
        out: list[Part | None] = [fn(*jobs[0])]
        for _, r in children:
            unread.discard(r)
            with os.fdopen(r, "rb") as fh:
                blob = fh.read()
            out.append(pickle.loads(blob) if blob else None)
        return out
    finally:
        for r in unread:  # the parent failed first: a child blocked on a full pipe gets EPIPE and exits
            os.close(r)
        for pid, _ in children:
            with contextlib.suppress(ChildProcessError):  # reaped already (a caller's SIGCHLD handler)
                os.waitpid(pid, 0)


def _has_devices(doc: TraceDoc) -> bool:
    """The profiler recorded GPU devices (Kineto writes deviceProperties for each): a trace of GPU kernels, whose
    ranges are reduced alone. A CPU trace's ranges would not be (its gloo threads are named anywhere in the file),
    and learning that from the workers would cost a second read."""
    try:
        devices = msgspec.json.decode(doc.deviceProperties)
    except _DECODE_ERRORS:
        return False
    return isinstance(devices, list) and bool(devices)


def split_trace(data: Buffer, path: Path, workers: int, fallback_rank: int | None = None) -> Trace | None:
    """The trace read by ``workers`` processes, or None where the one-pass reader must read it."""
    c = cut(data, workers)
    if c is None or len(c.ranges) < 2 or not _has_devices(c.doc):
        return None
    return reduce_cut(data, path, c, fallback_rank)


def reduce_cut(data: Buffer, path: Path, c: Cut, fallback_rank: int | None = None) -> Trace | None:
    """The trace from its ranges, one process each; None where a range does not decode as a run of events."""
    parts = [a for a in _fork_map(_reduce, [(data, s, e, str(path)) for s, e in c.ranges]) if a is not None]
    if len(parts) < len(c.ranges):
        return None  # undecodable, or a damaged event: the one-pass reader names the first problem, as always
    if not any(p.has_kernels for p in parts) or not sum(p.n_events for p in parts):
        return None  # a CPU trace (its gloo threads need the whole trace), or no events at all
    doc = c.doc
    return join_parts(RawTrace(str(path), [], doc.distributedInfo, doc.host_name), parts, True, fallback_rank)


def _read_private(path: Path) -> bytearray | None:
    """A big uncompressed trace read once into a private, writable buffer (the brackets written per range stay
    ours; no second copy); None for a small, compressed or oversized file. Read, not mapped: a file truncated
    while a map of it is read kills the process with SIGBUS, and a trace may be rewritten under us."""
    st = safe_io.check_regular(path)
    if st.st_size < MIN_SPLIT_BYTES or st.st_size > safe_io.max_input_bytes() or path.suffix == ".gz":
        return None  # a ".gz" is read_buffer's to check (named .gz but not gzip is bad input)
    try:
        with open(path, "rb") as fh:
            if fh.read(2) == safe_io.GZIP_MAGIC:
                return None
            fh.seek(0)
            buf = bytearray(st.st_size)
            got = fh.readinto(buf)
            if got != st.st_size or fh.read(1):  # the file changed size meanwhile: the one-pass reader decides
                return None
            return buf
    except (OSError, ValueError):
        return None


def load_trace(path: Path, fallback_rank: int | None = None, workers: int = 1) -> Trace:
    """One trace file as a Trace, its bytes read once; a big GPU trace on up to ``workers`` cores (forked workers,
    on Linux)."""
    path = Path(path)
    with no_gc():
        if workers > 1 and sys.platform.startswith("linux"):  # macOS system libraries are not fork-safe
            private = _read_private(path)
            # small or compressed: read (and decompressed) as the one-pass reader reads it
            data: Buffer = private if private is not None else read_buffer(path)
            if len(data) >= MIN_SPLIT_BYTES and (trace := split_trace(data, path, workers, fallback_rank)):
                return trace
            return build_trace(raw_from_bytes(data, path), fallback_rank)  # the same bytes, not a second read
        return build_trace(load_raw(path), fallback_rank)

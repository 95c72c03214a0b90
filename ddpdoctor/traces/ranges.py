"""A trace's traceEvents array as byte ranges cut at event boundaries, where the bytes come from (a Source: a file read
by range, or a buffer), and each range checked by decoding it as a whole JSON array of events. Shared by the
readers that use the ranges: traces/split.py (several cores) and traces/chunks.py (a range at a time)."""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from ddpdoctor.traces.loader import _DOC, _EVENTS, _TAGGED_EVENTS, DECODE_ERRORS, AnyEvent, TraceDoc

_MAX_EDGE = 4 << 20  # the head (before the array) and tail (after it) are decoded as one small document
_WINDOW = 64 << 10  # read at a cut's target to find the next boundary (an event is a few hundred bytes)
_OVERLAP = 256  # windows overlap: a boundary `}  ,  {` across two windows is seen whole in the second
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN = re.compile(rb"\}\s*,\s*\{")  # between two events (or inside a string or a nested array: checked)
Buffer = bytes | bytearray  # a file's bytes in memory, or a private (writable) copy of them


class Cut(NamedTuple):
    """Byte ranges [start, end) of the events, in order, and the metadata decoded around them."""

    ranges: list[tuple[int, int]]
    doc: TraceDoc


class FileChanged(Exception):
    """The file changed (size or modification time) while its ranges were read: the one-pass reader decides."""


def _changed(fd: int, st: os.stat_result) -> bool:
    """The open file's size or modification time differs from ``st`` (it was written since)."""
    now = os.fstat(fd)
    return (now.st_size, now.st_mtime_ns) != (st.st_size, st.st_mtime_ns)


@dataclass
class FileSource:
    """An open regular file, read by offset (pread), and what fstat said of it when it was opened."""

    fd: int
    st: os.stat_result

    @property
    def size(self) -> int:
        return self.st.st_size

    def read(self, offset: int, n: int) -> bytes:
        parts, got = [], 0
        while got < n:
            part = os.pread(self.fd, n - got, offset + got)
            if not part:
                raise FileChanged  # shorter than it was
            parts.append(part)
            got += len(part)
        self.check()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def check(self) -> None:
        """FileChanged when the file's size or modification time is no longer what it was when opened."""
        if _changed(self.fd, self.st):
            raise FileChanged

    def events(self, start: int, end: int) -> list[AnyEvent]:
        """The events of [start, end), mapped copy-on-write (no copy of the bytes; the brackets written into the
        separators before and after the range change this process's pages only). Only a reading process (a forked
        child) maps: a file truncated under a map kills the process that reads it, and a dead child is a range
        that did not decode, read again by the one-pass reader."""
        at = (start - 1) // mmap.ALLOCATIONGRANULARITY * mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(self.fd, end + 1 - at, offset=at, access=mmap.ACCESS_COPY)
        lo, hi = start - 1 - at, end - at
        mm[lo], mm[hi] = 0x5B, 0x5D  # '[' and ']'
        # The view is not released: the events' raw args point into it, and keep the map alive as they do.
        events = _tagged_or_any(memoryview(mm)[lo:hi + 1])
        self.check()
        return events


@dataclass
class BufferSource:
    """A trace's bytes in memory (decompressed, or read whole): forked children see them without a copy."""

    data: Buffer

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.data[offset:offset + n])

    def events(self, start: int, end: int) -> list[AnyEvent]:
        return decode_range(self.data, start, end)


Source = FileSource | BufferSource


def _source(data: Buffer | Source) -> Source:
    return data if isinstance(data, (FileSource, BufferSource)) else BufferSource(data)


def _edges(data: Buffer | Source) -> tuple[int, int, TraceDoc] | None:
    """(position of the array's '[', of its ']', the document without its events), when head and tail decode."""
    src = _source(data)
    head = src.read(0, min(src.size, _MAX_EDGE))
    m = _KEY.search(head)
    if m is None:
        return None
    lb = m.end() - 1
    # The head, closed right after the key, decodes only where the key is a field of the top-level object (not
    # inside a string or a nested object).
    try:
        _DOC.decode(head[:lb] + b"[]}")
    except DECODE_ERRORS:
        return None
    at = max(lb + 1, src.size - _MAX_EDGE)
    tail = src.read(at, src.size - at)
    rb = len(tail)
    for _ in range(8):  # the last ']' whose tail completes the document (a ']' inside a tail string is skipped)
        rb = tail.rfind(b"]", 0, rb)
        if rb < 0:
            return None
        rest = tail[rb + 1:]
        if b'"traceEvents"' in rest:
            return None  # a second traceEvents field: the one-pass reader decides what that means
        try:
            doc = _DOC.decode(head[:lb] + b"[]" + rest)
        except DECODE_ERRORS:
            continue
        return (lb, at + rb, doc) if not doc.traceEvents else None
    return None


def cut(data: Buffer | Source, n: int) -> Cut | None:
    """The events' byte ranges, about equal, at most n; None when the document's shape is not the usual one."""
    src = _source(data)
    edges = _edges(src)
    if edges is None:
        return None
    lb, rb, doc = edges
    return Cut(cut_at(src, lb, rb, [lb + 1 + (rb - lb - 1) * k // n for k in range(1, n)]), doc)


def _boundary(src: Source, at: int, rb: int) -> tuple[int, int] | None:
    """(start, end) of the first `},{` at or after ``at`` and before ``rb``, read window by window."""
    while at < rb:
        n = min(_WINDOW, rb - at)
        m = _BETWEEN.search(src.read(at, n))
        if m is not None:
            return at + m.start(), at + m.end()
        if at + n >= rb:
            return None
        at += n - _OVERLAP
    return None


def cut_at(data: Buffer | Source, lb: int, rb: int, targets: list[int]) -> list[tuple[int, int]]:
    """Ranges of the array [lb, rb] cut at the first `},{` after each target (in increasing order)."""
    src = _source(data)
    ranges: list[tuple[int, int]] = []
    start = lb + 1
    for target in targets:
        if target <= start:
            continue
        b = _boundary(src, target, rb)
        if b is None:
            break
        ranges.append((start, b[0] + 1))
        start = b[1] - 1
    ranges.append((start, rb))
    return ranges


def decode_range(data: Buffer, start: int, end: int) -> list[AnyEvent]:
    """The events of one range (raises msgspec's errors where the range is not a whole run of events), by phase
    (loader.XEvent...) or, where an event's phase is not one of the format's, as loader.Event. A writable buffer (a
    private copy of the file) gets the brackets in place, in the byte before and the byte after the range (a
    separator or blank) and back: no copy of the range."""
    if isinstance(data, bytes):
        return _tagged_or_any(b"[" + memoryview(data)[start:end] + b"]")
    before, after = data[start - 1], data[end]
    data[start - 1], data[end] = 0x5B, 0x5D  # '[' and ']'
    try:
        # The view is not released: the events' raw args point into it, and keep the buffer alive as they do.
        return _tagged_or_any(memoryview(data)[start - 1:end + 1])
    finally:
        data[start - 1], data[end] = before, after


def _tagged_or_any(buf: Buffer | memoryview) -> list[AnyEvent]:
    try:
        events: list[AnyEvent] = _TAGGED_EVENTS.decode(buf)
        return events
    except msgspec.ValidationError:
        return list(_EVENTS.decode(buf))

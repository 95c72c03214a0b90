"""Reads one PyTorch profiler (Kineto/Chrome) trace, .json or .json.gz, into the few columns the analyses need.

Speed: a typed msgspec decoder materialises only ph/name/cat/pid/tid/ts/dur per event and keeps ``args`` as raw
bytes, decoded later only for the handful of events that need them (collectives, kernels' correlation ids,
AccumulateGrad). The garbage collector is off while decoding: it is the main cost of naive JSON parsing."""

from __future__ import annotations

import contextlib
import functools
import gc
import operator
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

import msgspec

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput

GZIP_MAGIC = b"\x1f\x8b"


class _Fields(msgspec.Struct, gc=False):
    """What a complete or metadata event carries that any analysis reads (args kept as raw JSON)."""

    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = 0.0
    dur: float = 0.0
    args: msgspec.Raw = msgspec.Raw(b"null")


class Event(_Fields, gc=False):
    """Any event, whatever its phase (the reader of last resort, and the shape tests build)."""

    ph: str = ""


# The fast reader tells events apart by their phase, as msgspec's tagged union: a complete ('X') event gets every
# field, a metadata ('M') event the same, and an event of any other phase of the Chrome trace format (flow arrows,
# instants, counters: a third of a GPU trace's events, none of them read by an analysis) no field at all, so its
# name, timestamps and args are skipped by the parser instead of built and thrown away. ``ph`` stays readable as a
# class attribute. A phase outside the format's set, or an event without one, fails this reader and the file is
# read again with ``Event`` (the same result, or the same error, as before).
class XEvent(_Fields, gc=False, tag_field="ph", tag="X"):
    ph: ClassVar[str] = "X"


class MEvent(_Fields, gc=False, tag_field="ph", tag="M"):
    ph: ClassVar[str] = "M"


class OtherEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of a phase no analysis reads (its fields are not decoded)."""

    ph: ClassVar[str] = "?"


# The Chrome trace event format's phases (B/E durations, instants, counters, async, flows, samples, objects, memory
# dumps, marks, context); X and M are the two read.
_OTHER_PHASES = "BEIiCbneSTpFstfPONDVvRc()"
_OTHERS = tuple(msgspec.defstruct(f"Phase{ord(ph)}", [], bases=(OtherEvent,), tag=ph, gc=False,
                                  namespace={"ph": ph}) for ph in _OTHER_PHASES)
AnyEvent = Event | XEvent | MEvent | OtherEvent
_TAGGED_UNION: Any = functools.reduce(operator.or_, (XEvent, MEvent, *_OTHERS))  # a union built at run time


class _TaggedDoc(Protocol):
    traceEvents: list[AnyEvent]
    distributedInfo: DistributedInfo | None
    host_name: str | None


class PGConfig(msgspec.Struct):
    pg_name: str | None = None
    pg_desc: str | None = None
    pg_size: int | None = None
    ranks: list[int] | str | None = None


class DistributedInfo(msgspec.Struct):
    backend: str | None = None
    rank: int | None = None
    world_size: int | None = None
    pg_config: list[PGConfig] | None = None
    nccl_version: str | None = None


class TraceDoc(msgspec.Struct):
    traceEvents: list[Event]
    distributedInfo: DistributedInfo | None = None
    deviceProperties: msgspec.Raw = msgspec.Raw(b"null")
    host_name: str | None = None


class EventArgs(msgspec.Struct):
    """The args fields any analysis reads (decoded lazily, per event)."""

    correlation: int | None = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    dtype: str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    seq: int | None = msgspec.field(default=None, name="Seq")
    # Newer torch (profiler/util.cpp saveNcclMeta): a hash of (group name, Seq, p2p, rank start, stride, size) written
    # as a bare integer beside Seq; the same on every rank for one collective (docs/metrics.md#collective-matching).
    comms_id: int | str | None = msgspec.field(default=None, name="Comms Id")
    name: Any = None  # metadata events: thread_name / process_name


# What decoding untrusted JSON with msgspec can raise (RecursionError: nesting past msgspec's own bound).
DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError)
_DOC = msgspec.json.Decoder(TraceDoc)
_EVENTS = msgspec.json.Decoder(list[Event])
_TAGGED_DOC = msgspec.json.Decoder(msgspec.defstruct("TaggedDoc", [
    ("traceEvents", list[_TAGGED_UNION]),
    ("distributedInfo", DistributedInfo | None, None),
    ("deviceProperties", msgspec.Raw, msgspec.Raw(b"null")),
    ("host_name", str | None, None),
]))
_TAGGED_EVENTS = msgspec.json.Decoder(list[_TAGGED_UNION])
_ARGS = msgspec.json.Decoder(EventArgs)


class Correlation(msgspec.Struct, gc=False):
    """The one args field read for every kernel and runtime call (traces/scan.py): decoded alone, their other args
    are skipped, not built."""

    correlation: int | None = None


_CORRELATION = msgspec.json.Decoder(Correlation)


def complete_events(events: list[AnyEvent]) -> list[Event | XEvent]:
    """The complete ('X') events, in order (one pass; the only ones the analyses classify)."""
    return [e for e in events if type(e) is XEvent or (type(e) is Event and e.ph == "X")]  # type: ignore[misc]


def metadata_events(events: list[AnyEvent]) -> list[Event | MEvent]:
    """The metadata ('M') events, in order (thread and process names)."""
    return [e for e in events if type(e) is MEvent or (type(e) is Event and e.ph == "M")]  # type: ignore[misc]


def decode_args(raw: msgspec.Raw) -> EventArgs:
    try:
        return _ARGS.decode(raw)
    except DECODE_ERRORS:
        return EventArgs()


@dataclass
class RawTrace:
    path: str
    events: list[AnyEvent]
    dist: DistributedInfo | None
    host: str | None
    notes: list[str] = field(default_factory=list)


def read_bytes(path: Path) -> bytes:
    """The file's JSON bytes, bounded (safe_io: regular files only, gzip by its magic bytes decompressed as a
    stream with a cap, a corrupt or truncated stream named with its byte offset)."""
    data = read_buffer(path)
    return data if isinstance(data, bytes) else bytes(data)


def read_buffer(path: Path) -> bytes | bytearray:
    """read_bytes, with decompressed data left in the bytearray it was decompressed into (no copy)."""
    data = safe_io.read_buffer(path)
    if path.suffix == ".gz" and not _was_gzip(path):
        raise BadInput("named .gz but is not gzip-compressed", path)
    return data


def _was_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:  # read_bytes has checked it is a regular file
        return fh.read(2) == GZIP_MAGIC


def _decode(data: bytes | bytearray, path: Path) -> tuple[TraceDoc, list[str]]:
    notes: list[str] = []
    try:
        return _DOC.decode(data), notes
    except UnicodeDecodeError:
        return _utf8_replaced(data, path, notes)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if data.lstrip()[:1] == b"[":
            # The bare Chrome trace format: a JSON array of events.
            return TraceDoc(traceEvents=_bare_events(data, path)), notes
        if "missing required field `traceEvents`" in text:
            raise BadInput("not a PyTorch profiler trace (no traceEvents)", path) from exc
        raise BadInput(f"not a PyTorch profiler trace ({text})", path) from exc
    except msgspec.DecodeError as exc:
        if safe_io.bad_utf8(exc):
            return _utf8_replaced(data, path, notes)
        problem = "truncated JSON" if "truncated" in str(exc) else f"not valid JSON ({exc})"
        raise BadInput(problem, path) from exc
    except RecursionError as exc:
        # msgspec bounds nesting itself, in C, before Python's stack is at risk (no separate pre-scan of a
        # 500 MB trace is needed): a trace is a few levels deep, so this is a damaged or hostile file.
        raise BadInput(f"JSON nested too deeply (more than {sys.getrecursionlimit()} levels)", path) from exc


def _utf8_replaced(data: bytes | bytearray, path: Path, notes: list[str]) -> tuple[TraceDoc, list[str]]:
    # Invalid UTF-8 inside a name: keep the trace, replace the bad bytes (HTA's parser gives up here).
    notes.append(f"{path}: invalid UTF-8 replaced with U+FFFD")
    return _decode(bytes(data).decode("utf-8", "replace").encode("utf-8"), path)[0], notes


def _bare_events(data: bytes | bytearray, path: Path) -> list[Event]:
    try:
        return _EVENTS.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        raise BadInput(f"not a PyTorch profiler trace ({exc})", path) from exc


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a trace is decoded and reduced: its passes over the hundreds of
    thousands of objects being built (none of them in a cycle) cost a third of building a rank's columns."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_raw(path: Path) -> RawTrace:
    """Decode one trace file; raise BadInput (one line naming the file) when it is not a usable trace."""
    path = Path(path)
    return raw_from_bytes(read_buffer(path), path)


# Perfetto's protobuf trace (Kineto's Perfetto SDK consumer writes one "alongside other output formats" when a
# downstream build turns it on; the pinned torch 2.13 exposes no switch for it): a Trace message, whose first byte is
# field 1 (TracePacket), length-delimited, 0x0a, followed by binary varints.
_PERFETTO_NAMES = (".pftrace", ".perfetto-trace", ".perfetto")
PERFETTO_PROBLEM = ("a Perfetto protobuf trace, not the profiler's Chrome JSON: give ddpdoctor the JSON trace Kineto "
                    "writes beside it (prof.export_chrome_trace('rank0.pt.trace.json') or "
                    "torch.profiler.tensorboard_trace_handler), or convert this one with Perfetto's "
                    "`traceconv json TRACE.pftrace TRACE.json`")


def is_perfetto(data: bytes | bytearray, path: Path) -> bool:
    """Whether a file is a Perfetto protobuf trace (by its name, or by its first bytes: 0x0a then binary)."""
    if path.name.endswith(_PERFETTO_NAMES):
        return True
    return data[:1] == b"\x0a" and any(b < 9 or 13 < b < 32 for b in data[1:64])


def raw_from_bytes(data: bytes | bytearray, path: Path) -> RawTrace:
    """Decode one trace file's bytes (read_bytes); BadInput as load_raw."""
    if not data or data.isspace():  # (no stripped copy of a 100 MB file)
        raise BadInput("empty file", path)
    if is_perfetto(data, path):
        raise BadInput(PERFETTO_PROBLEM, path)
    with no_gc():
        try:
            fast: _TaggedDoc | None = cast(_TaggedDoc, _TAGGED_DOC.decode(data))
        except DECODE_ERRORS:
            fast = None  # read again by the reader of last resort, which names the problem or reads what this cannot
        if fast is not None:
            events: list[AnyEvent] = fast.traceEvents
            dist, host, notes = fast.distributedInfo, fast.host_name, list[str]()
        else:
            doc, notes = _decode(data, path)
            events, dist, host = cast("list[AnyEvent]", doc.traceEvents), doc.distributedInfo, doc.host_name
    if not events:
        raise BadInput("trace has no events", path)
    return RawTrace(str(path), events, dist, host, notes)


_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_ ]?(\d+)", re.IGNORECASE)


def rank_from_filename(path: str | Path) -> int | None:
    """rank3, rank-3, rank_3, worker names like `host_rank3.123.pt.trace.json`; None when absent."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None

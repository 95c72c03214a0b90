"""Reading Chrome/Kineto traces for the views (merge, TensorBoard timeline) with msgspec, one chunk of events at a
time: the file's bytes stay in memory once, the events are decoded and dropped a few MB at a time."""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput

CHUNK_BYTES = 8 << 20


class ChromeEvent(msgspec.Struct, omit_defaults=True, gc=False):
    """One Chrome-trace event with the fields the format defines. Fields the views do not change stay raw JSON
    bytes (never re-parsed); unset ones are not written back. Fields outside the format are dropped."""

    # Typed where the views read or change a field, so a damaged trace is a one-line BadInput, not a TypeError.
    ph: str | msgspec.UnsetType = msgspec.UNSET
    name: str | msgspec.UnsetType = msgspec.UNSET
    cat: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    pid: int | str | None | msgspec.UnsetType = msgspec.UNSET
    tid: int | str | None | msgspec.UnsetType = msgspec.UNSET
    ts: int | float | msgspec.UnsetType = msgspec.UNSET
    dur: int | float | msgspec.UnsetType = msgspec.UNSET
    tts: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    tdur: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    id: int | str | None | msgspec.UnsetType = msgspec.UNSET
    id2: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    bp: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    s: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    scope: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    cname: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    bind_id: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    flow_in: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    flow_out: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    args: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


class _Outer(msgspec.Struct):
    traceEvents: msgspec.Raw
    distributedInfo: msgspec.Raw = msgspec.Raw(b"null")
    host_name: Any = None


_OUTER = msgspec.json.Decoder(_Outer)
_EVENTS = msgspec.json.Decoder(list[ChromeEvent])
_GENERIC = msgspec.json.Decoder()
ENCODER = msgspec.json.Encoder()
_SPACE = b" \t\r\n"


@dataclass
class Trace:
    """One trace file: its bytes, where its event array lies in them, and the rank hints next to it."""

    raw: bytes
    path: Path
    start: int  # index of the array's "["
    end: int  # index just past its "]"
    dist: Mapping[str, object] = field(default_factory=dict)  # the trace's distributedInfo, raw (rank, backend read)
    host: str | None = None

    @property
    def nbytes(self) -> int:
        return len(self.raw)

    def chunks(self, chunk_bytes: int = CHUNK_BYTES) -> Iterator[list[ChromeEvent]]:
        """The events, a list of about ``chunk_bytes`` of JSON at a time, in file order."""
        raw, pos, last = self.raw, self.start + 1, self.end - 1  # inside the brackets
        while pos < last:
            for cut in _cuts(raw, pos, last, chunk_bytes):
                try:
                    events = _decode_chunk(raw, pos, cut)
                except msgspec.ValidationError as exc:
                    raise BadInput(f"not a Chrome/PyTorch profiler trace ({exc})", self.path) from exc
                except msgspec.DecodeError as exc:
                    if cut >= last:
                        raise BadInput(f"not valid JSON ({exc})", self.path) from exc
                    continue  # the "}," was inside a string: try the next one
                except RecursionError as exc:
                    raise BadInput("JSON nested too deeply", self.path) from exc
                break
            if events:
                yield events
            pos = cut + 1  # past the comma

    @property
    def events(self) -> list[ChromeEvent]:
        return [ev for chunk in self.chunks() for ev in chunk]


def _cuts(raw: bytes, pos: int, last: int, chunk_bytes: int) -> Iterator[int]:
    """Candidate ends of a chunk: commas after a "}" at least ``chunk_bytes`` past ``pos``, then ``last``."""
    probe = pos + chunk_bytes
    while probe < last:
        brace = raw.find(b"}", probe, last)
        if brace < 0:
            break
        comma = brace + 1
        while comma < last and raw[comma] in _SPACE:
            comma += 1
        if comma < last and raw[comma] == 0x2C:  # ","
            yield comma
        probe = brace + 1
    yield last


def _decode_chunk(raw: bytes, pos: int, cut: int) -> list[ChromeEvent]:
    piece = b"[" + raw[pos:cut] + b"]"
    try:
        return _typed(piece)
    except (UnicodeDecodeError, msgspec.DecodeError) as exc:
        if not safe_io.bad_utf8(exc):
            raise
        # Invalid UTF-8 inside a name: keep the events with U+FFFD, as the analysis's loader does.
        return _typed(piece.decode("utf-8", "replace").encode("utf-8"))


def _typed(piece: bytes) -> list[ChromeEvent]:
    try:
        return _EVENTS.decode(piece)
    except msgspec.ValidationError:
        # Non-object entries (a stray number or null): skipped, as Perfetto does; a wrong type in an event is not.
        items = [e for e in _GENERIC.decode(piece) if isinstance(e, dict)]
        return _EVENTS.decode(ENCODER.encode(items))


def _array_span(raw: bytes, events: msgspec.Raw, path: Path) -> tuple[int, int]:
    """Where the traceEvents array (``events``, a view into ``raw``) starts and ends in ``raw``."""
    view = memoryview(events)
    n = len(view)
    at = raw.find(b'"traceEvents"')
    while at >= 0:
        start = raw.find(b"[", at)
        if start >= 0 and memoryview(raw)[start:start + n] == view:
            return start, start + n
        at = raw.find(b'"traceEvents"', at + 1)
    raise BadInput("not a Chrome/PyTorch profiler trace (traceEvents not found)", path)


def read_trace(path: Path) -> Trace:
    """A profiler trace (.json or .json.gz, or a bare event array): validated and located, events decoded
    lazily by ``Trace.chunks()``; BadInput naming the file and the problem."""
    from ddpdoctor.safe_io import read_bytes

    path = Path(path)
    if path.name.endswith(".gz"):
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                raise BadInput("named .gz but is not gzip-compressed", path)
    raw = read_bytes(path)
    enabled = gc.isenabled()
    gc.disable()
    try:
        stripped = raw.lstrip()
        if stripped[:1] == b"[":
            _GENERIC.decode(raw)  # validates; a bare array is rare and small
            start = raw.find(b"[")
            return Trace(raw, path, start, len(raw.rstrip()))
        outer = _OUTER.decode(raw)
    except UnicodeDecodeError as exc:
        raise BadInput(f"not UTF-8 text ({exc.reason})", path) from exc
    except msgspec.ValidationError as exc:
        if "traceEvents" in str(exc):
            raise BadInput("not a Chrome/PyTorch profiler trace (no traceEvents list)", path) from exc
        raise BadInput(f"not a Chrome/PyTorch profiler trace ({exc})", path) from exc
    except msgspec.DecodeError as exc:
        problem = "invalid UTF-8" if "UTF-8" in str(exc) else str(exc)
        raise BadInput(f"not valid JSON ({problem})", path) from exc
    except RecursionError as exc:
        raise BadInput("JSON nested too deeply", path) from exc
    finally:
        if enabled:
            gc.enable()
    if bytes(memoryview(outer.traceEvents)[:1]) != b"[":
        raise BadInput("not a Chrome/PyTorch profiler trace (no traceEvents list)", path)
    start, end = _array_span(raw, outer.traceEvents, path)
    try:
        dist = msgspec.json.decode(outer.distributedInfo)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        dist = None
    host = outer.host_name if isinstance(outer.host_name, str) else None
    return Trace(raw, path, start, end, dist if isinstance(dist, dict) else {}, host)


def event_args(ev: ChromeEvent) -> Mapping[str, object]:
    """An event's args, decoded (free-form per event: read by key, never trusted)."""
    if isinstance(ev.args, msgspec.Raw):
        try:
            value = msgspec.json.decode(ev.args)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def raw_text(raw: Any) -> str:
    """A raw JSON string field (an event's cat) as text; anything else as ''."""
    if isinstance(raw, msgspec.Raw):
        try:
            value = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            return ""
        return value if isinstance(value, str) else ""
    return ""

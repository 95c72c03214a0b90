"""Flight Recorder dumps (pickle via a restricted unpickler, or JSON) -> each rank's collective progress per group."""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.errors import BadInput

PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only dict/list/str/int/float/bool/None/tuple: any GLOBAL (class or function) is refused, so a
    crafted dump cannot run code. Flight Recorder pickles hold nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a Flight Recorder dump holds plain data only")


# Bounds on what a dump may hold. A real dump (2,000 ring-buffer entries with their frames) is a few MB, some
# 10^5 objects. Shared references are counted each time they are used: a pickle can reference one list from many
# places (a 404-byte input can stand for 2^100 objects), and everything that walks the value walks it expanded.
MAX_PICKLE_BYTES = 256 * 1024 * 1024
MAX_OPCODES = 20_000_000
MAX_OBJECTS = 5_000_000
MAX_EXPANDED_BYTES = 1 << 30
MAX_DEPTH = 64


def _check_opcodes(data: bytes) -> None:
    """Refuse a pickle with more opcodes than MAX_OPCODES before building anything (each one may make an object)."""
    import pickletools

    for count, _ in enumerate(pickletools.genops(data), start=1):
        if count > MAX_OPCODES:
            raise pickle.UnpicklingError(f"more than {MAX_OPCODES:,} pickle operations")


def _leaf_size(item: Any) -> int:
    if isinstance(item, str | bytes):
        return len(item)
    if isinstance(item, int) and not isinstance(item, bool):
        return item.bit_length() // 8 + 1
    if isinstance(item, float | bool | type(None)):
        return 8
    raise pickle.UnpicklingError(f"unexpected {type(item).__name__}")


def _children(item: Any) -> list[Any] | None:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, list | tuple):
        return list(item)
    return None


def _check_plain(value: Any) -> None:
    """Plain data only, within MAX_DEPTH, and within MAX_OBJECTS and MAX_EXPANDED_BYTES once every shared reference
    is counted each time it is used. The expanded totals are computed once per distinct container (memoised by
    identity, post-order, no recursion), so a reference bomb is refused at the cost of its own size."""
    totals: dict[int, tuple[int, int]] = {}  # id(container) -> (objects, bytes) it expands to
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(value, 0, False)]
    while stack:
        item, depth, done = stack.pop()
        kids = _children(item)
        if kids is None:
            continue
        key = id(item)
        if done:
            objects, size = 1, 8 * len(kids)
            for kid in kids:
                k_objects, k_size = totals[id(kid)] if _children(kid) is not None else (1, _leaf_size(kid))
                objects += k_objects
                size += k_size
            if objects > MAX_OBJECTS:
                raise pickle.UnpicklingError(f"more than {MAX_OBJECTS:,} objects once shared references are expanded")
            if size > MAX_EXPANDED_BYTES:
                raise pickle.UnpicklingError(f"expands past {MAX_EXPANDED_BYTES >> 20} MiB once shared references "
                                             "are expanded")
            totals[key] = (objects, size)
            on_path.discard(key)
            continue
        if key in totals:
            continue
        if key in on_path:
            raise pickle.UnpicklingError("a container that holds itself")
        if depth > MAX_DEPTH:
            raise pickle.UnpicklingError("nested too deeply")
        on_path.add(key)
        stack.append((item, depth, True))
        stack.extend((kid, depth + 1, False) for kid in kids if _children(kid) is not None)


def loads_pickle(data: bytes, name: str = "<pickle>") -> Mapping[str, object]:
    try:
        if len(data) > MAX_PICKLE_BYTES:
            raise pickle.UnpicklingError(f"larger than {MAX_PICKLE_BYTES >> 20} MiB")
        _check_opcodes(data)
        value = _PlainDataUnpickler(io.BytesIO(data)).load()
        _check_plain(value)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, OverflowError,
            MemoryError, RecursionError, AttributeError, UnicodeDecodeError) as exc:
        raise BadInput(f"not a Flight Recorder dump that can be read safely ({exc})", name) from exc
    if not is_dump(value):
        raise BadInput("a pickle, but not a Flight Recorder dump (no 'entries'/'pg_status')", name)
    return value


def loads_json(text: str | bytes, name: str = "<json>") -> Mapping[str, object]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"not valid JSON ({exc})", name) from exc
    if not is_dump(value):
        raise BadInput("JSON, but not a Flight Recorder dump (no 'entries'/'pg_status')", name)
    return value


def is_dump(value: Any) -> bool:
    return isinstance(value, dict) and ("entries" in value or "pg_status" in value) and "version" in value


@dataclass(frozen=True)
class FrCollective:
    seq: int
    op: str
    group: str
    input_sizes: list[Any]
    state: str
    call_site: str | None


@dataclass
class FrGroupState:
    """One rank's progress in one process group, by collective sequence number (-1: none yet)."""

    group: str
    last_enqueued: int
    last_started: int
    last_completed: int
    collectives: dict[int, FrCollective] = field(default_factory=dict)


def _int(value: Any, default: int = -1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _call_site(entry: Mapping[str, object]) -> str | None:
    """The innermost frame outside torch (NCCL dumps carry Python frames; gloo dumps carry none)."""
    frames = entry.get("frames")
    if not isinstance(frames, list):
        return None
    for frame in frames:  # Flight Recorder lists the innermost frame first
        if not isinstance(frame, dict):
            continue
        filename = str(frame.get("filename", ""))
        if filename and "site-packages/" not in filename and "/torch/" not in filename and not filename.startswith("<"):
            return f"{filename}:{frame.get('line', '?')}"
    return None


def group_states(dump: Mapping[str, object]) -> dict[str, FrGroupState]:
    """Per process group (by pg id as a string): the last enqueued/started/completed collective and each entry."""
    states: dict[str, FrGroupState] = {}
    names: dict[str, str] = {}
    raw_entries = dump.get("entries")
    entries: list[Any] = raw_entries if isinstance(raw_entries, list) else []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("is_p2p"):
            continue
        pg_id = str(entry.get("pg_id", "0"))
        pg = entry.get("process_group")
        if isinstance(pg, list | tuple) and len(pg) == 2 and pg[1]:
            names[pg_id] = str(pg[1])
        seq = _int(entry.get("collective_seq_id"))
        if seq < 0:
            continue
        op = str(entry.get("profiling_name", "?")).split(":")[-1]
        state = states.setdefault(pg_id, FrGroupState(pg_id, -1, -1, -1))
        state.collectives[seq] = FrCollective(seq, op, pg_id, entry.get("input_sizes") or [], str(entry.get("state")),
                                              _call_site(entry))
        state.last_enqueued = max(state.last_enqueued, seq)
        if entry.get("state") in ("started", "completed"):
            state.last_started = max(state.last_started, seq)
        if entry.get("state") == "completed":
            state.last_completed = max(state.last_completed, seq)
    raw_status = dump.get("pg_status")
    pg_status: dict[Any, Any] = raw_status if isinstance(raw_status, dict) else {}
    for pg_id, status in pg_status.items():
        if not isinstance(status, dict):
            continue
        state = states.setdefault(str(pg_id), FrGroupState(str(pg_id), -1, -1, -1))
        # pg_status is the recorder's own counter: it survives the ring buffer dropping old entries.
        state.last_enqueued = max(state.last_enqueued, _int(status.get("last_enqueued_collective")))
        state.last_started = max(state.last_started, _int(status.get("last_started_collective")))
        state.last_completed = max(state.last_completed, _int(status.get("last_completed_collective")))
    for pg_id, state in states.items():
        if pg_id in names:
            state.group = f"{pg_id} ({names[pg_id]})"
    return states

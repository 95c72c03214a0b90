"""Flight Recorder dumps (pickle via a restricted unpickler, or JSON) -> each rank's collective progress per group."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.errors import BadInput

PICKLE_MAGIC = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")


class _PlainDataUnpickler(pickle.Unpickler):
    """Builds only dict/list/str/int/float/bool/None/tuple: any GLOBAL (class or function) is refused, so a
    crafted dump cannot run code. Flight Recorder pickles hold nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a Flight Recorder dump holds plain data only")


def _check_plain(value: Any, depth: int = 0) -> None:
    if depth > 64:
        raise pickle.UnpicklingError("nested too deeply")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
    elif isinstance(value, list | tuple):
        for v in value:
            _check_plain(v, depth + 1)
    elif not isinstance(value, str | int | float | bool | type(None)):
        raise pickle.UnpicklingError(f"unexpected {type(value).__name__}")


def loads_pickle(data: bytes, name: str = "<pickle>") -> dict[str, Any]:
    try:
        value = _PlainDataUnpickler(io.BytesIO(data)).load()
        _check_plain(value)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, OverflowError,
            MemoryError, RecursionError, AttributeError, UnicodeDecodeError) as exc:
        raise BadInput(f"not a Flight Recorder dump that can be read safely ({exc})", name) from exc
    if not is_dump(value):
        raise BadInput("a pickle, but not a Flight Recorder dump (no 'entries'/'pg_status')", name)
    return value


def loads_json(text: str | bytes, name: str = "<json>") -> dict[str, Any]:
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


def _call_site(entry: dict[str, Any]) -> str | None:
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


def group_states(dump: dict[str, Any]) -> dict[str, FrGroupState]:
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

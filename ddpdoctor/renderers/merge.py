"""The all-ranks timeline: one Chrome/Perfetto trace, each rank its own process (pid = rank), clocks aligned."""

from __future__ import annotations

import gzip
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor.errors import BadInput
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.renderers.chrome_trace import ENCODER, ChromeEvent, Trace, event_args, raw_text, read_trace
from ddpdoctor.safe_io import temp_name

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
# The source trace's own process metadata is replaced by ours (pid = rank); thread names are kept.
_DROPPED_META = {"process_name", "process_labels", "process_sort_index"}
# Flow ids ("s"/"f"/"t" events) are per trace; shifting them by rank keeps two ranks' arrows apart.
_FLOW_ID_STRIDE = 1 << 40


def trace_paths(paths: list[Path]) -> list[Path]:
    """The trace files behind `analyze`'s arguments: a run directory's traces/, a folder's *.json[.gz], files."""
    found: list[Path] = []
    for p in paths:
        if (p / "manifest.json").is_file() and (p / "traces").is_dir():
            found.extend(sorted((p / "traces").glob("*.pt.trace.json*")))
        elif p.is_dir():
            found.extend(sorted(q for q in p.iterdir() if q.is_file() and q.name.endswith((".json", ".json.gz"))))
        else:
            found.append(p)
    return found


def trace_rank(trace: Trace, path: Path, fallback: int) -> int:
    """distributedInfo.rank, else "rankN" in the file name, else ``fallback`` (the file's position)."""
    rank = trace.dist.get("rank")
    if isinstance(rank, int):
        return rank
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else fallback


def _offsets(clock_offsets_us: Mapping[Any, Any] | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for k, v in (clock_offsets_us or {}).items():
        if isinstance(v, (int, float)):
            out[int(k)] = float(v)
    return out


class TraceStats:
    """What one pass over a trace's events tells the merge: the training process and the other processes' names."""

    def __init__(self, trace: Trace) -> None:
        counts: dict[Any, int] = {}
        names: dict[Any, str] = {}
        labels: dict[Any, str] = {}
        seen = 0
        for chunk in trace.chunks():
            for ev in chunk:
                if ev.ph == "M":
                    args = event_args(ev)
                    if ev.name == "process_name" and args.get("name"):
                        names[ev.pid] = str(args["name"])
                    elif ev.name == "process_labels" and args.get("labels"):
                        labels[ev.pid] = str(args["labels"])
                elif ev.ph == "X" and isinstance(ev.pid, int) and seen < 200000:
                    seen += 1
                    weight = 4 if raw_text(ev.cat) in ("cpu_op", "user_annotation") else 1
                    counts[ev.pid] = counts.get(ev.pid, 0) + weight
        # The training process runs the CPU ops: the most common integer pid of complete events.
        self.main_pid = max(counts, key=counts.__getitem__) if counts else None
        # A short name per other process: Kineto's label ("GPU 0") when it has one, else its process name when
        # that differs from the training process's (traces often give every pid the job's name).
        self.labels: dict[Any, str] = {}
        for pid in set(names) | set(labels):
            if pid in labels and pid != self.main_pid:
                self.labels[pid] = labels[pid]
            elif pid in names and names[pid] != names.get(self.main_pid):
                self.labels[pid] = names[pid]


def _header_events(trace: Trace, rank: int, offset_us: float) -> list[JsonObject]:
    host = trace.host
    out: list[JsonObject] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
         "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
    labels = []
    if trace.dist.get("backend"):
        labels.append(str(trace.dist["backend"]))
    if offset_us:
        labels.append(f"clock shifted {-offset_us:+.1f} us")
    if labels:
        out.append({"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": ", ".join(labels)}})
    return out


def _move(ev: ChromeEvent, rank: int, offset_us: float, stats: TraceStats) -> None:
    """One event moved into process ``rank`` on rank 0's clock (ts - offset), in place."""
    # Other processes of the trace (GPU devices, the profiler's "Spans") become threads named after them,
    # so a GPU stream 7 never lands on the same track as a CPU thread 7.
    pid = ev.pid
    if pid != stats.main_pid and pid not in (None, "", msgspec.UNSET):
        label = stats.labels.get(pid, f"pid {pid}")
        if ev.ph == "M" and ev.name == "thread_name":
            thread = event_args(ev).get("name", ev.tid)
            ev.args = msgspec.Raw(ENCODER.encode({"name": f"{label} {thread}".strip()}))
        ev.tid = f"{label}: {ev.tid}"
    ev.pid = rank
    if offset_us and isinstance(ev.ts, (int, float)) and not isinstance(ev.ts, bool):
        ev.ts = ev.ts - offset_us
    if ev.ph in ("s", "t", "f") and isinstance(ev.id, int) and not isinstance(ev.id, bool):
        ev.id = ev.id + rank * _FLOW_ID_STRIDE


def _discard(tmp: Path) -> None:
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def merge_traces(
    traces: list[Path],
    out: Path,
    clock_offsets_us: Mapping[Any, Any] | None = None,
    ranks: Mapping[str, int] | None = None,
    on_file: Callable[[Path], None] | None = None,
) -> Path:
    """Write ``out`` (gzip when it ends in .gz): every trace's events, pid = rank, ts aligned to rank 0's clock.

    ``clock_offsets_us[rank]`` is how far that rank's clock runs ahead of rank 0's, so rank 0's time is
    ``ts - offset``. ``ranks`` maps a trace path (as given) to its rank when the analysis already decided it.
    One trace's bytes are in memory at a time; its events are decoded (msgspec, args never parsed), moved and
    written a few MB at a time, so memory stays near the largest trace's size.
    """
    if not traces:
        raise BadInput("no traces to merge", out)
    offsets = _offsets(clock_offsets_us)
    seen: dict[int, Path] = {}
    tmp = temp_name(out)  # unpredictable, created O_EXCL|O_NOFOLLOW 0600: never a planted link (issue 40 item 4)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        raw_out = os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600),
                            "wb")
        # Level 1: the merged trace is a view to open once; level 9 would cost more than the whole merge.
        fh: Any = gzip.GzipFile(fileobj=raw_out, mode="wb", compresslevel=1, mtime=0) if out.name.endswith(".gz") \
            else raw_out
        try:
            fh.write(b'{"displayTimeUnit": "ms", "traceEvents": [\n')
            first = True
            for i, path in enumerate(traces):
                trace = read_trace(path)
                known = ranks or {}
                rank = known.get(str(path), known.get(str(path.resolve()), trace_rank(trace, path, i)))
                if rank in seen:
                    raise BadInput(f"claims rank {rank}, as {seen[rank]} does", path)
                seen[rank] = path
                offset = offsets.get(rank, 0.0)
                first = _write_chunk(fh, _header_events(trace, rank, offset), first)
                stats = TraceStats(trace)
                for chunk in trace.chunks():
                    kept = [ev for ev in chunk if not (ev.ph == "M" and ev.name in _DROPPED_META)]
                    for ev in kept:
                        _move(ev, rank, offset, stats)
                    first = _write_chunk(fh, kept, first)
                    del chunk, kept
                del trace
                if on_file:
                    on_file(path)
            other = {"ddpdoctor": {"ranks": {str(r): str(p) for r, p in sorted(seen.items())},
                                   "clock_offsets_us": {str(k): v for k, v in sorted(offsets.items())}}}
            fh.write(b"\n], \"otherData\": " + ENCODER.encode(other) + b"}\n")
        finally:
            fh.close()
            raw_out.close()
        tmp.replace(out)
    except OSError as exc:
        _discard(tmp)
        raise BadInput(f"cannot write the merged trace ({exc.strerror or exc})", out) from exc
    except BaseException:
        _discard(tmp)
        raise
    return out


def _write_chunk(fh: Any, chunk: list[Any], first: bool) -> bool:
    """Append events to the open traceEvents array; returns whether the array is still empty."""
    if not chunk:
        return first
    body = ENCODER.encode(chunk)[1:-1]  # the list's items, without its brackets
    fh.write((b"" if first else b",\n") + body)
    return False

"""The all-ranks timeline: one Chrome/Perfetto trace, each rank its own process (pid = rank), clocks aligned."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from ddpdoctor.errors import BadInput

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


def read_trace(path: Path) -> dict[str, Any]:
    """A profiler trace (.json or .json.gz) as a dict, or BadInput naming the file and the problem."""
    from ddpdoctor.traces.loader import read_bytes

    raw = read_bytes(path)  # bounded: regular files only, streamed gzip with a cap
    try:
        # msgspec bounds nesting in C (RecursionError, never a blown stack), and is faster than json here.
        data = msgspec.json.decode(raw)
    except UnicodeDecodeError as exc:
        raise BadInput(f"not UTF-8 text ({exc.reason})", path) from exc
    except msgspec.DecodeError as exc:
        raise BadInput(f"not valid JSON ({exc})", path) from exc
    except RecursionError as exc:
        raise BadInput("JSON nested too deeply", path) from exc
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise BadInput("not a Chrome/PyTorch profiler trace (no traceEvents list)", path)
    from ddpdoctor.rundir.artefacts import validate

    validate(data, _MergeDoc, path)  # the fields the merge reads have their types (events stay dicts)
    return data


class _MergeEvent(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    id: int | str | None = None
    args: dict[str, Any] | None = None


class _MergeDist(msgspec.Struct):
    rank: int | None = None
    backend: str | None = None


class _MergeDoc(msgspec.Struct):
    traceEvents: list[_MergeEvent | list[Any] | str | int | float | bool | None]
    distributedInfo: _MergeDist | None = None
    host_name: str | None = None


def trace_rank(data: dict[str, Any], path: Path, fallback: int) -> int:
    """distributedInfo.rank, else "rankN" in the file name, else ``fallback`` (the file's position)."""
    rank = (data.get("distributedInfo") or {}).get("rank")
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


def _main_pid(events: list[Any]) -> Any:
    """The pid of the training process: the one running the CPU ops (the most common integer pid)."""
    counts: dict[Any, int] = {}
    for ev in events[:200000]:
        if isinstance(ev, dict) and ev.get("ph") == "X" and isinstance(ev.get("pid"), int):
            counts[ev["pid"]] = counts.get(ev["pid"], 0) + (4 if ev.get("cat") in ("cpu_op", "user_annotation") else 1)
    return max(counts, key=counts.__getitem__) if counts else None


def _process_labels(events: list[Any], main_pid: Any) -> dict[Any, str]:
    """A short name per non-training process of a trace: Kineto's label ("GPU 0") when it has one, else its
    process name when that differs from the training process's (traces often give every pid the job's name)."""
    names: dict[Any, str] = {}
    labels: dict[Any, str] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M":
            args = ev.get("args") or {}
            if ev.get("name") == "process_name" and args.get("name"):
                names[ev.get("pid")] = str(args["name"])
            elif ev.get("name") == "process_labels" and args.get("labels"):
                labels[ev.get("pid")] = str(args["labels"])
    out: dict[Any, str] = {}
    for pid in set(names) | set(labels):
        if pid in labels and pid != main_pid:
            out[pid] = labels[pid]
        elif pid in names and names[pid] != names.get(main_pid):
            out[pid] = names[pid]
    return out


def _rank_events(data: dict[str, Any], rank: int, offset_us: float) -> Iterable[dict[str, Any]]:
    """The rank's events moved into process ``rank`` on rank 0's clock (ts - offset)."""
    host = data.get("host_name")
    yield {"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
           "args": {"name": f"rank {rank}" + (f" ({host})" if host else "")}}
    yield {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
    labels = []
    dist = data.get("distributedInfo") or {}
    if dist.get("backend"):
        labels.append(str(dist["backend"]))
    if offset_us:
        labels.append(f"clock shifted {-offset_us:+.1f} us")
    if labels:
        yield {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": ", ".join(labels)}}
    events = data["traceEvents"]
    main_pid = _main_pid(events)
    names = _process_labels(events, main_pid)
    for ev in events:
        if not isinstance(ev, dict):
            continue
        if ev.get("ph") == "M" and ev.get("name") in _DROPPED_META:
            continue
        out = dict(ev)
        out["pid"] = rank
        # Other processes of the trace (GPU devices, the profiler's "Spans") become threads named after them,
        # so a GPU stream 7 never lands on the same track as a CPU thread 7.
        pid = ev.get("pid")
        if pid != main_pid and pid not in (None, ""):
            label = names.get(pid, f"pid {pid}")
            out["tid"] = f"{label}: {ev.get('tid')}"
            if ev.get("ph") == "M" and ev.get("name") == "thread_name":
                out["args"] = {"name": f"{label} {(ev.get('args') or {}).get('name', ev.get('tid'))}".strip()}
        ts = ev.get("ts")
        if isinstance(ts, (int, float)) and offset_us:
            out["ts"] = ts - offset_us
        if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
            out["id"] = ev["id"] + rank * _FLOW_ID_STRIDE
        yield out


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
    """
    if not traces:
        raise BadInput("no traces to merge", out)
    offsets = _offsets(clock_offsets_us)
    seen: dict[int, Path] = {}
    tmp = out.with_name(f".{out.name}.tmp")
    opener = gzip.open if out.name.endswith(".gz") else open
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with opener(tmp, "wt", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            first = True
            for i, path in enumerate(traces):
                data = read_trace(path)
                known = ranks or {}
                rank = known.get(str(path), known.get(str(path.resolve()), trace_rank(data, path, i)))
                if rank in seen:
                    raise BadInput(f"claims rank {rank}, as {seen[rank]} does", path)
                seen[rank] = path
                for ev in _rank_events(data, rank, offsets.get(rank, 0.0)):
                    fh.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":"), default=str))
                    first = False
                del data
                if on_file:
                    on_file(path)
            other = {"ddpdoctor": {"ranks": {str(r): str(p) for r, p in sorted(seen.items())},
                                   "clock_offsets_us": {str(k): v for k, v in sorted(offsets.items())}}}
            fh.write("\n], \"otherData\": " + json.dumps(other) + "}\n")
        tmp.replace(out)
    except OSError as exc:
        _discard(tmp)
        raise BadInput(f"cannot write the merged trace ({exc.strerror or exc})", out) from exc
    except BaseException:
        _discard(tmp)
        raise
    return out

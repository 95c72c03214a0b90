"""One big trace read by several processes (traces/split.py) gives exactly the columns of the one-pass reader,
and a cut that lands inside a string or a nested array is refused, never trusted."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest

from ddpdoctor.analyses.rank import analyze_trace
from ddpdoctor.analyses.results import asdict
from ddpdoctor.errors import BadInput
from ddpdoctor.traces import ranges, split
from ddpdoctor.traces.loader import Event, MEvent, OtherEvent, XEvent, raw_from_bytes
from ddpdoctor.traces.trace import Trace, build_trace
from tests.conftest import shared_path
from tests.unit.tracebuild import gpu_trace, x


def assert_same(a: Trace, b: Trace) -> None:
    for col in ("compute", "memory", "backward", "data_wait"):
        for f in ("start", "end", "launch"):
            assert np.array_equal(getattr(getattr(a, col), f), getattr(getattr(b, col), f), equal_nan=True), (col, f)
    assert (a.n_events, a.device, a.rank, a.rank_source, a.world_size, a.backend, a.host, a.groups) == \
        (b.n_events, b.device, b.rank, b.rank_source, b.world_size, b.backend, b.host, b.groups)
    assert a.steps == b.steps and a.syncs == b.syncs and a.enqueues == b.enqueues and a.grads == b.grads
    assert [(c.name, c.start, c.end, c.tid, c.args) for c in a.comm] == \
        [(c.name, c.start, c.end, c.tid, c.args) for c in b.comm]
    np.testing.assert_array_equal([c.launch for c in a.comm], [c.launch for c in b.comm])
    assert asdict(analyze_trace(a)) == asdict(analyze_trace(b))


def serial(data: bytes, path: Path) -> Trace:
    return build_trace(raw_from_bytes(data, path))


@pytest.mark.shared
@pytest.mark.parametrize("workers", [2, 3])
def test_real_trace_split_equals_one_pass(workers: int) -> None:
    path = shared_path("traces", "a100_8gpu_rank3", "control.json.gz")
    data = gzip.decompress(path.read_bytes())
    c = split.cut(data, workers)
    assert c is not None and len(c.ranges) == workers
    # The ranges tile the array: each starts at an event's '{' and ends after one's '}'.
    assert all(data[s:s + 1] == b"{" for s, _ in c.ranges[1:]) and all(data[e - 1:e] == b"}" for _, e in c.ranges[:-1])
    t = split.split_trace(data, path, workers)
    assert t is not None and t.device == "gpu"
    assert_same(t, serial(data, path))


def tricky_doc() -> dict:
    """A GPU trace whose names hold what looks like an event boundary or the array's end, whose args hold a nested
    array of objects, and whose tail (after the events) holds a ']' inside a string."""
    doc = gpu_trace(0)
    ev = doc["traceEvents"]
    ev.insert(3, x('weird"},{"ph": "X"}]', 12, 1, tid=2))
    ev.insert(5, x("aten::nested", 13, 1, tid=2, shapes=[{"a": 1}, {"b": [2]}]))
    ev.extend(x(f"aten::op{i}", 300 + i, 1, tid=2) for i in range(40))
    doc["traceName"] = "run ], {"
    return doc


@pytest.mark.parametrize("kind", [bytes, bytearray])  # read bytes (each range copied) or a private map (in place)
def test_cut_inside_a_string_or_nested_array_is_refused(tmp_path: Path, kind: type) -> None:
    data = kind(json.dumps(tricky_doc()).encode())
    path = tmp_path / "rank0.json"
    edges = split._edges(data)
    assert edges is not None
    lb, rb, doc = edges
    assert data[rb + 1:].strip().startswith(b",") and doc.distributedInfo is not None
    one_pass = serial(bytes(data), path)
    inside_string = data.index(b'},{\\"ph')  # the first `},{` after here is inside the name's string
    inside_nested = data.index(b'"a": 1}') + 1
    for at in (inside_string - 1, inside_nested):
        ranges = split.cut_at(data, lb, rb, [at])
        assert len(ranges) == 2
        assert split.reduce_cut(data, path, split.Cut(ranges, doc)) is None  # the range does not decode: refused
    # A cut between two events is kept, and gives the one-pass columns (cuts in many places).
    for at in range(lb + 1, rb, max(1, (rb - lb) // 25)):
        ranges = split.cut_at(data, lb, rb, [at])
        got = split.reduce_cut(data, path, split.Cut(ranges, doc))
        if got is not None:
            assert_same(got, one_pass)
        else:
            assert not all(decodes(data, s, e) for s, e in ranges)
    assert bytes(data) == json.dumps(tricky_doc()).encode()  # the brackets written in place are taken back


def decodes(data: split.Buffer, start: int, end: int) -> bool:
    try:
        split.decode_range(data, start, end)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True


def test_load_trace_falls_back_to_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split, "MIN_SPLIT_BYTES", 0)
    data = json.dumps(tricky_doc()).encode()
    path = tmp_path / "rank0.json"
    path.write_bytes(data)
    assert_same(split.load_trace(path, workers=2), serial(data, path))
    gz = tmp_path / "rank0.json.gz"  # decompressed into a bytearray: the ranges get their brackets in place
    gz.write_bytes(gzip.compress(data))
    assert_same(split.load_trace(gz, workers=2), serial(data, gz))
    # A CPU trace (no devices, or devices and no kernel) and a bare event array are read in one pass.
    cpu = {"traceEvents": [x("ProfilerStep#1", 0, 10), x("aten::mm", 1, 2)] * 3}
    for doc in (cpu, {**cpu, "deviceProperties": [{"id": 0}]}, cpu["traceEvents"]):
        path.write_bytes(json.dumps(doc).encode())
        assert split.split_trace(path.read_bytes(), path, 2) is None
        assert_same(split.load_trace(path, workers=2), serial(path.read_bytes(), path))


@pytest.mark.shared
@pytest.mark.parametrize("workers", [2, 3])
def test_file_ranges_read_by_offset_equal_one_pass(tmp_path: Path, workers: int) -> None:
    """An uncompressed file is cut by reading only its head, its tail and a window at each cut; each range is read by
    the process that decodes it. Same columns as the one-pass reader."""
    data = gzip.decompress(shared_path("traces", "a100_8gpu_rank3", "control.json.gz").read_bytes())
    path = tmp_path / "rank3.pt.trace.json"
    path.write_bytes(data)
    with split._open_big(path) as src:
        assert isinstance(src, split.FileSource)
        c = split._plan(src, workers)
        assert c is not None and [r for r in c.ranges] == split.cut(data, workers).ranges  # type: ignore[union-attr]
        t = split.reduce_cut(src, path, c)
    assert t is not None
    one_pass = serial(data, path)
    assert_same(t, one_pass)
    assert_same(split.load_trace(path, workers=workers), one_pass)


def test_a_window_search_finds_a_boundary_across_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut targets whose next boundary lies windows away, or across two windows' edge, give the same ranges as a
    search of the whole buffer."""
    monkeypatch.setattr(ranges, "_WINDOW", 300)  # where the boundary search reads it
    data = json.dumps(tricky_doc(), indent=1).encode()  # `},\n  {`: a boundary with blanks in it
    lb, rb, _ = split._edges(data)  # type: ignore[misc]
    for at in range(lb + 1, rb, 7):
        m = split._BETWEEN.search(data, at, rb)
        want = None if m is None else (m.start(), m.end())
        assert split._boundary(split.BufferSource(data), at, rb) == want, at


@contextlib.contextmanager
def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, split.FileSource, split.Cut]]:
    """The tricky trace written to a file, open, and cut in two (as if big)."""
    monkeypatch.setattr(split, "MIN_SPLIT_BYTES", 0)
    path = tmp_path / "rank0.json"
    path.write_bytes(json.dumps(tricky_doc()).encode())
    with split._open_big(path) as src:
        assert src is not None
        c = split._plan(src, 2)
        assert c is not None
        yield path, src, c


def test_a_file_that_changes_while_read_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with planned(tmp_path, monkeypatch) as (path, src, c):
        with path.open("ab") as fh:  # grows after it was opened: its size no longer matches
            fh.write(b"  ")
        assert split.reduce_cut(src, path, c) is None
        with pytest.raises(split.FileChanged):
            src.events(*c.ranges[0])
    assert_same(split.load_trace(path, workers=2), serial(path.read_bytes(), path))


def test_prefetch_is_collected_by_load_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = json.dumps(tricky_doc()).encode()
    monkeypatch.setattr(split, "MIN_SPLIT_BYTES", len(data) - 1)  # the tricky trace is "big", the others small
    path, other, gz = tmp_path / "rank0.json", tmp_path / "rank1.json", tmp_path / "rank0.json.gz"
    path.write_bytes(data)
    gz.write_bytes(gzip.compress(data))
    other.write_bytes(json.dumps(gpu_trace(1)).encode())
    small_gz, cpu_gz = tmp_path / "small.json.gz", tmp_path / "cpu.json.gz"
    small_gz.write_bytes(gzip.compress(other.read_bytes()))
    cpu = {"traceEvents": [x("ProfilerStep#1", 0, 10), x("aten::mm", 1, 2)] * 200}
    cpu_gz.write_bytes(gzip.compress(json.dumps(cpu).encode()))
    assert len(other.read_bytes()) < len(data) <= len(json.dumps(cpu))
    # Only one big GPU trace file named alone is started (several files are read one per process, by the pipeline).
    for alone in (other, small_gz, cpu_gz, tmp_path, tmp_path / "missing.json"):
        with split.prefetch([alone], 2):
            assert not split._PREFETCHED, alone
    with split.prefetch([path, gz], 2):
        assert not split._PREFETCHED
    with split.prefetch([gz], 2):  # decompressed and cut by one reading process
        zipped = split._PREFETCHED[split._file_id(gz)]  # type: ignore[index]
        assert len(zipped.children) == 1 and zipped.cut is None
        got = split._PREFETCHED.pop(split._file_id(gz)).collect(gz, None)  # type: ignore[arg-type]  # as load_trace
        assert got is not None and not zipped.children and zipped.fd == -1
        assert_same(got, serial(data, gz))
    with split.prefetch([path], 2):  # read by offset, one reading process per range
        pending = split._PREFETCHED[split._file_id(path)]  # type: ignore[index]
        assert len(pending.children) == 2 and pending.cut is not None
        # Found by the file it names: a relative path, or a link to it, is the same file.
        link = tmp_path / "link.json"
        link.symlink_to(path)
        assert_same(split.load_trace(link, workers=2), serial(data, link))
        assert not split._PREFETCHED and pending.fd == -1 and not pending.children
    # The path names another file by the time it is loaded: that file is read, not what was prefetched.
    with split.prefetch([path], 2):
        other.replace(path)
        got = split.load_trace(path, workers=2)
        assert got.rank == 1
        assert_same(got, serial(path.read_bytes(), path))
    # Changed in place after it was read: not collected, read again.
    path.write_bytes(data)
    with split.prefetch([path], 2):
        pending = split._PREFETCHED[split._file_id(path)]  # type: ignore[index]
        with path.open("r+b") as fh:
            fh.seek(0, os.SEEK_END)
            fh.write(b" ")
        assert pending.collect(path, None) is None and not pending.children and pending.fd == -1
        assert_same(split.load_trace(path, workers=2), serial(path.read_bytes(), path))
    # Never collected: discarded on the way out, its processes reaped and its file closed.
    with split.prefetch([path], 2):
        pending = split._PREFETCHED[split._file_id(path)]  # type: ignore[index]
        fd, pids = pending.fd, [pid for pid, _ in pending.children]
    assert not split._PREFETCHED and pending.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_an_unknown_phase_is_read_by_the_reader_of_last_resort(tmp_path: Path) -> None:
    """Events are decoded by phase; a phase outside the Chrome format's set (or none) still reads, as before."""
    known = tricky_doc()
    known["traceEvents"] += [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "stream 7"}},
                             {"ph": "s", "id": 1, "ts": 1, "pid": 1, "tid": 1, "cat": "ac2g", "name": "ac2g"}]
    doc = json.loads(json.dumps(known))
    doc["traceEvents"].append({"ph": "Z", "name": "future", "ts": 1})
    doc["traceEvents"].append({"name": "no phase", "ts": 2})
    raw = raw_from_bytes(json.dumps(doc).encode(), tmp_path / "t.json")
    assert all(type(e) is Event for e in raw.events)
    plain = raw_from_bytes(json.dumps(known).encode(), tmp_path / "t.json")
    kinds = {type(e) for e in plain.events}
    assert {XEvent, MEvent} < kinds and any(issubclass(k, OtherEvent) and k.ph == "s" for k in kinds)
    t, u = build_trace(raw), build_trace(plain)
    assert t.n_events == u.n_events + 2
    u.n_events = t.n_events
    assert_same(t, u)


def _die_by_sigbus() -> None:
    os.kill(os.getpid(), signal.SIGBUS)  # what reading a map of a file truncated meanwhile does


def test_a_reader_killed_by_a_signal_is_a_range_that_did_not_decode(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assert split._gather(split._spawn(_die_by_sigbus, [()]), split.Part) == [None]
    # A file cut short after its plan: its ranges no longer map or decode; the one-pass reader names the problem.
    with planned(tmp_path, monkeypatch) as (path, src, c):
        os.truncate(path, path.stat().st_size // 2)
        assert split.reduce_cut(src, path, c) is None
    with pytest.raises(BadInput, match="truncated JSON"):
        split.load_trace(path, workers=2)

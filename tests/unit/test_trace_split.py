"""One big trace read by several processes (traces/split.py) gives exactly the columns of the one-pass reader,
and a cut that lands inside a string or a nested array is refused, never trusted."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import numpy as np
import pytest

from ddpdoctor.analyses.rank import analyze_trace
from ddpdoctor.analyses.results import asdict
from ddpdoctor.traces import split
from ddpdoctor.traces.loader import raw_from_bytes
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

"""A big trace read a range at a time (traces/chunks.py) gives exactly the one-pass reader's columns, errors and
notes; what it cannot read as the one-pass reader would (a GPU kernel, a range that does not decode, an FSDP2 trace
with a damaged op) it leaves to the one-pass reader. The ranges are made small here so that small traces cut into
many."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.traces import chunks, split
from ddpdoctor.traces.split import BufferSource
from tests.fuzz.long_inputs import write_many_steps_trace
from tests.unit.test_fsdp_trace import fsdp_cpu_trace
from tests.unit.test_trace_split import assert_same, serial
from tests.unit.tracebuild import GLOO, cpu_trace, gpu_trace, meta, x

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 700)
    monkeypatch.setattr(chunks, "MIN_CHUNKED_BYTES", 0)


def chunked(data: bytes, path: Path) -> object:
    return chunks.read_chunked(BufferSource(bytearray(data)), path)


def both(data: bytes, path: Path) -> None:
    """The chunked reader took the trace (in several ranges) and gave the one-pass columns."""
    got = chunked(data, path)
    assert got is not None
    assert_same(got, serial(data, path))  # type: ignore[arg-type]


def test_real_gloo_traces_read_in_ranges_equal_one_pass(tmp_path: Path) -> None:
    for f in sorted((FIXTURES / "verdicts" / "healthy_run1" / "traces").glob("*.json.gz")):
        data = gzip.decompress(f.read_bytes())
        assert len(data) > 50 * chunks.CHUNK_BYTES
        both(data, tmp_path / f.name.removesuffix(".gz"))


def test_gloo_threads_named_after_their_events(tmp_path: Path) -> None:
    """Kineto may name the threads at the end of the file: the first pass finds them before any range is reduced
    (a gloo thread's ops are not compute)."""
    doc = cpu_trace(0)
    names = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] != "M"] * 20 + names
    doc["traceEvents"].insert(3, x("aten::add on gloo's thread", 1, 2, tid=GLOO))
    both(json.dumps(doc).encode(), tmp_path / "rank0.json")


def test_many_steps_file_and_the_cli_path(tmp_path: Path) -> None:
    path = write_many_steps_trace(tmp_path / "rank0.pt.trace.json", 300)
    data = path.read_bytes()
    both(data, path)
    assert_same(split.load_trace(path, workers=2), serial(data, path))  # the file read by offset, range by range
    assert_same(split.load_trace(path, workers=1), serial(data, path))


def test_fsdp_wrappers_across_ranges(tmp_path: Path) -> None:
    doc = fsdp_cpu_trace()
    doc["traceEvents"] += [x(f"aten::op{i}", 100 + i, 1) for i in range(60)]
    doc["traceEvents"].append(meta(7, "thread 7 (python)"))
    both(json.dumps(doc).encode(), tmp_path / "rank0.json")


def test_names_that_look_like_a_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `},{` inside a name or a nested array is not a place to cut: the range does not decode, and the cut moves
    to the next boundary (with one try only, the reader gives the trace to the one-pass reader)."""
    doc = cpu_trace(0)
    doc["traceEvents"] *= 10
    for i in range(0, len(doc["traceEvents"]), 7):
        doc["traceEvents"].insert(i, x('weird"},{"ph": "X"}]', 1 + i, 1, shapes=[{"a": 1}, {"b": [2]}]))
    data = json.dumps(doc).encode()
    passes: list[str] = []
    decoded_ranges = chunks._decoded_ranges

    def spy(src: object, lb: int, rb: int, decode: Callable[..., object]) -> object:
        passes.append(decode.__name__)
        return decoded_ranges(src, lb, rb, decode)  # type: ignore[arg-type]

    monkeypatch.setattr(chunks, "_decoded_ranges", spy)
    both(data, tmp_path / "rank0.json")
    # A range without metadata, skipped unchecked, was cut inside a name: the metadata pass checked every range.
    assert passes == ["_metadata", "_all_metadata", "_tagged_or_any"]
    monkeypatch.setattr(chunks, "_TRIES", 1)
    assert chunked(data, tmp_path / "rank0.json") is None


def error(fn: object, *args: object) -> str:
    with pytest.raises(BadInput) as exc:
        fn(*args)  # type: ignore[operator]
    return str(exc.value)


def test_bad_durations_name_the_one_pass_readers_event(tmp_path: Path) -> None:
    """The one-pass reader checks a CPU trace's compute ops after every other event: a damaged step after a damaged
    op is the one named, whichever range each is in."""
    path = tmp_path / "rank0.json"
    base = cpu_trace(0)
    base["traceEvents"] *= 20
    op = copy.deepcopy(base)
    op["traceEvents"].insert(5, x("aten::mm", 3, -1.0))
    step = copy.deepcopy(op)
    step["traceEvents"].append(x("ProfilerStep#99", 9000, -2.0, cat="user_annotation"))
    for doc in (op, step):
        data = json.dumps(doc).encode()
        assert error(chunked, data, path) == error(serial, data, path)
    assert "aten::mm" in error(chunked, json.dumps(op).encode(), path)
    assert "ProfilerStep#99" in error(chunked, json.dumps(step).encode(), path)
    # Under FSDP2 whether the damaged op counts depends on every FSDP range: the one-pass reader decides.
    fsdp = fsdp_cpu_trace()
    fsdp["traceEvents"] += [x(f"aten::op{i}", 100 + i, 1) for i in range(40)] + [x("aten::mm", 62, -1.0)]
    assert chunked(json.dumps(fsdp).encode(), path) is None


def test_what_it_leaves_to_the_one_pass_reader(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    big = [x(f"aten::op{i}", i, 1) for i in range(40)]
    gpu = gpu_trace(0)
    gpu["traceEvents"] = big + gpu["traceEvents"]
    cpu = cpu_trace(0)
    cpu["traceEvents"] *= 10
    damaged = json.dumps(cpu).encode().replace(b"SGD.step", b"SGD.\xff\xfe", 1)
    for data in (json.dumps(gpu).encode(), json.dumps({"traceEvents": []}).encode(), damaged,
                 json.dumps(cpu["traceEvents"]).encode()):  # a bare array of events: no document around it
        assert chunked(data, path) is None
    path.write_bytes(damaged)
    t = split.load_trace(path)
    assert t.notes == serial(damaged, path).notes and "U+FFFD" in t.notes[0]
    # An event of a phase outside the format is read, as the reader of last resort reads it.
    odd = copy.deepcopy(cpu)
    odd["traceEvents"].insert(4, {**x("aten::odd", 5, 1), "ph": "Z"})
    both(json.dumps(odd).encode(), path)

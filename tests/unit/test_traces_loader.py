"""The trace loader on good and bad input: one BadInput naming the file, never another exception (fuzzed)."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.errors import BadInput
from ddpdoctor.traces.loader import load_raw, rank_from_filename
from ddpdoctor.traces.trace import build_trace
from tests.unit.tracebuild import cpu_trace, gpu_trace, write

GOOD = json.dumps(cpu_trace(0)).encode()


@pytest.mark.parametrize("name,data,problem", [
    ("t.json", GOOD[: len(GOOD) // 2], "truncated JSON"),
    ("t.json.gz", GOOD, "not gzip"),
    ("t.json.gz", gzip.compress(GOOD)[:-30], "gzip data is truncated at byte"),
    ("t.json", b'{"hello": [1, 2]}', "not a PyTorch profiler trace"),
    ("t.json", b'{"traceEvents": []}', "no events"),
    ("t.json", b"", "empty file"),
    ("t.json", b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "not a PyTorch profiler trace"),
    ("t.json", b"\x00\x01garbage", "not valid JSON"),
])
def test_bad_files_are_one_line(tmp_path, name, data, problem):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(BadInput) as exc:
        load_raw(p)
    assert problem in str(exc.value) and str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_gzip_detected_by_magic_not_suffix(tmp_path):
    p = tmp_path / "plain_name.json"
    p.write_bytes(gzip.compress(GOOD))
    assert len(load_raw(p).events) == len(cpu_trace(0)["traceEvents"])


def test_bare_event_array_and_float_ns(tmp_path):
    ev = gpu_trace(0)["traceEvents"]
    for e in ev:
        if "ts" in e:
            e["ts"] += 0.123  # float nanosecond precision in microseconds
    t = build_trace(load_raw(write(tmp_path / "arr.json", ev)))
    assert t.device == "gpu" and len(t.comm) == 3 and t.compute.start[0] == pytest.approx(20.123)


def test_huge_integers_and_invalid_utf8(tmp_path):
    doc = cpu_trace(0)
    text = json.dumps(doc).replace('"pid": 1', '"pid": 99999999999999999999999', 1)
    text = text.replace('"args": {}', '"args": {"big": 123456789012345678901234567890}', 1)
    data = text.encode().replace(b"SGD.step", b"SGD.\xff\xfestep")
    p = tmp_path / "weird.json"
    p.write_bytes(data)
    raw = load_raw(p)
    assert any("invalid UTF-8" in n for n in raw.notes)
    a = analyze_paths([p])
    assert a.ranks[0].comm_us == pytest.approx(64)


def test_empty_folder_and_missing_path(tmp_path):
    with pytest.raises(BadInput, match="no profiler traces"):
        analyze_paths([tmp_path])
    with pytest.raises(BadInput, match="no such file"):
        analyze_paths([tmp_path / "nope.json"])


def test_duplicate_rank_is_bad_input(tmp_path):
    write(tmp_path / "a.json", cpu_trace(0))
    write(tmp_path / "b.json", cpu_trace(0))
    with pytest.raises(BadInput, match="two traces claim rank 0"):
        analyze_paths([tmp_path])


def test_one_bad_file_among_good_ones_is_a_warning(tmp_path):
    write(tmp_path / "a.json", cpu_trace(0))
    (tmp_path / "b.json").write_text('{"traceEvents": [')
    a = analyze_paths([tmp_path])
    assert [r.rank for r in a.ranks] == [0]
    assert any("skipped" in n and "b.json" in n for n in a.notes)


@pytest.mark.parametrize("name,rank", [("rank3.123.pt.trace.json.gz", 3), ("job-rank-12.json", 12),
                                       ("x_rank_7.json", 7), ("worker0.json", None), ("frank1.json", None)])
def test_rank_from_filename(name, rank):
    assert rank_from_filename(name) == rank


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(cut=st.integers(0, len(GOOD)), flip=st.integers(0, len(GOOD) - 1), byte=st.integers(0, 255),
       gz=st.booleans())
def test_fuzz_loader_never_raises_anything_but_badinput(tmp_path, cut, flip, byte, gz):
    data = bytearray(GOOD[:cut] if cut % 3 == 0 else GOOD)
    if data:
        data[flip % len(data)] = byte
    if gz:
        data = bytearray(gzip.compress(bytes(data)))
    p = tmp_path / "f.json"
    p.write_bytes(bytes(data))
    try:
        build_trace(load_raw(p))
    except BadInput as exc:
        assert str(p) in str(exc)


event = st.fixed_dictionaries({
    "ph": st.sampled_from(["X", "M", "i", "s"]),
    "name": st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "gloo:all_reduce", "aten::mm", "c10d::allreduce_",
                             "ncclDevKernel_Generic_1", "void k", "Memset", "thread_name",
                             "autograd::engine::evaluate_function: X", "torch::autograd::AccumulateGrad"]),
    "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memset", "cuda_runtime"]),
    "tid": st.integers(0, 3), "pid": st.integers(0, 2),
    "ts": st.floats(0, 1e6, allow_nan=False), "dur": st.floats(0, 1e4, allow_nan=False),
    "args": st.one_of(st.just({}), st.fixed_dictionaries({"correlation": st.integers(0, 5),
                                                          "Input Dims": st.just([[3, 4]]),
                                                          "Input type": st.just(["float"])})),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(event, min_size=1, max_size=40))
def test_fuzz_analysis_of_arbitrary_events(tmp_path, events):
    p = write(tmp_path / "e.json", {"traceEvents": events})
    try:
        a = analyze_paths([p])
    except BadInput as exc:  # nothing per step to measure is said as bad input, never "ok"
        assert "no ProfilerStep" in str(exc)
        return
    sec = a.to_sections()
    text = json.dumps(sec)
    assert "NaN" not in text and "Infinity" not in text


def test_profile_report_survives_unusable_traces(tmp_path):
    from ddpdoctor.reports.analyze import assemble_run_dir as analyze_run
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(tmp_path)
    run.traces.mkdir(parents=True)
    run.manifest.write_text("{}")
    (run.traces / "rank0.1.pt.trace.json.gz").write_bytes(b"\x1f\x8b broken")
    report = analyze_run(run)
    assert report.sections == {} and "traces not analysed" in report.notes[0] and "rank0.1" in report.notes[0]

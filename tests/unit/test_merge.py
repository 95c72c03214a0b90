"""The merged all-ranks trace: pid = rank, our process names, clocks aligned by clock_offsets_us, bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.renderers.merge import merge_traces, trace_paths
from tests.conftest import shared_path


def _trace(rank: int | None, pid: int, t0: float) -> dict:
    """A small profiler-like trace written by hand: a step, a gloo all_reduce on its own thread, a flow, and a
    GPU-like pseudo-process (pid 0) whose stream 7 must not collide with anything."""
    info = {"distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}} if rank is not None else {}
    return {
        "schemaVersion": 1, "host_name": "node-a", **info,
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid + 1, "args": {"name": "pt_gloo_runloop"}},
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": pid, "tid": pid, "ts": t0, "dur": 100.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": t0 + 10, "dur": 20.0},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid, "tid": pid + 1,
             "ts": t0 + 50, "dur": 30.0},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 5, "pid": pid, "tid": pid, "ts": t0 + 10},
            {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "id": 5, "pid": pid, "tid": pid, "ts": t0 + 60, "bp": "e"},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t0 + 12, "dur": 5.0},
        ],
    }


def _write(path: Path, data: dict) -> Path:
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_ranks_become_processes_and_clocks_align(tmp_path):
    # Rank 1's clock runs 250 us ahead of rank 0's: its all_reduce at 1000+250+50 is at 1050 on rank 0's clock.
    a = _write(tmp_path / "rank0.1.pt.trace.json.gz", _trace(0, 4001, 1000.0))
    b = _write(tmp_path / "worker.pt.trace.json", _trace(1, 4002, 1250.0))
    out = merge_traces([a, b], tmp_path / "merged.json.gz", {"0": 0.0, "1": 250.0})
    data = _load(out)
    ev = data["traceEvents"]
    assert {e["pid"] for e in ev} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0 (node-a)", 1: "rank 1 (node-a)"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in ev if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort == {0: 0, 1: 1}
    ar = {e["pid"]: e["ts"] for e in ev if e.get("name") == "gloo:all_reduce"}
    assert ar == {0: 1050.0, 1: 1050.0}
    steps = {e["pid"]: e["ts"] for e in ev if e.get("name") == "ProfilerStep#3"}
    assert steps == {0: 1000.0, 1: 1000.0}
    # Flow arrows of different ranks no longer share an id; within a rank start and end still pair up.
    flows = {(e["pid"], e["ph"]): e["id"] for e in ev if e.get("cat") == "fwdbwd"}
    assert flows[(0, "s")] == flows[(0, "f")] != flows[(1, "s")] == flows[(1, "f")]
    # The GPU pseudo-process becomes a named thread of its rank; the CPU thread keeps its id.
    kernels = [e for e in ev if e.get("name") == "k"]
    assert {e["tid"] for e in kernels} == {"GPU 0: 7"}
    assert {e["tid"] for e in ev if e.get("name") == "aten::mm"} == {4001, 4002}
    assert data["otherData"]["ddpdoctor"]["clock_offsets_us"] == {"0": 0.0, "1": 250.0}


def test_rank_from_filename_and_given_mapping(tmp_path):
    a = _write(tmp_path / "rank3.trace.json", _trace(None, 10, 0.0))
    b = _write(tmp_path / "other.json", _trace(None, 11, 0.0))
    out = merge_traces([a, b], tmp_path / "m.json", ranks={str(b): 5})
    ev = json.loads(out.read_text())["traceEvents"]
    assert {e["pid"] for e in ev} == {3, 5}


def test_two_traces_claiming_one_rank(tmp_path):
    a = _write(tmp_path / "a.json", _trace(0, 10, 0.0))
    b = _write(tmp_path / "b.json", _trace(0, 11, 0.0))
    with pytest.raises(BadInput, match="claims rank 0"):
        merge_traces([a, b], tmp_path / "m.json.gz")
    assert not (tmp_path / "m.json.gz").exists()


def test_invalid_utf8_and_stray_entries_are_kept_or_skipped(tmp_path):
    odd = tmp_path / "rank0.pt.trace.json"
    odd.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a\xffb", "pid": 1, "tid": 1, "ts": 5, "dur": 1}, 7, '
                    b'{"ph": "X", "name": "c},{", "pid": 1, "tid": 1, "ts": 6, "dur": 1, "zz": 1}]}')
    ev = _load(merge_traces([odd], tmp_path / "m.json.gz"))["traceEvents"]
    assert [e["name"] for e in ev if e.get("ph") == "X"] == ["a\ufffdb", "c},{"]


def test_damaged_events_are_one_line_bad_input_or_kept(tmp_path):
    """Found by fuzzing (h12's suite): a null entry next to invalid UTF-8, bad UTF-8 inside args, wrong types."""
    odd = tmp_path / "rank0.pt.trace.json"
    odd.write_bytes(b'{"traceEvents": [null, {"ph": "\xb2", "name": "n", "pid": 1, "tid": 1, "ts": 1, "dur": 1}, '
                    b'{"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "\x91"}}]}')
    ev = _load(merge_traces([odd], tmp_path / "m.json.gz"))["traceEvents"]
    assert [e["ph"] for e in ev if e.get("name") == "n"] == ["\ufffd"]
    for bad in (b'{"traceEvents": [{"ph": "X", "pid": {"a": 1}}]}', b'{"traceEvents": [{"ts": "soon"}]}',
                b'{"traceEvents": [' + b"[" * 5000 + b"]" * 5000 + b"]}"):
        odd.write_bytes(bad)
        with pytest.raises(BadInput) as exc:
            merge_traces([odd], tmp_path / "m.json.gz")
        assert "\n" not in str(exc.value) and str(odd) in str(exc.value)


def test_chunks_split_between_events_never_inside_a_string(tmp_path):
    from ddpdoctor.renderers.chrome_trace import read_trace

    events = [{"ph": "X", "name": f"op{i}" + ("},{" * (i % 3)), "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {"s": "}, {"}} for i in range(500)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    chunks = list(read_trace(path).chunks(chunk_bytes=97))
    assert len(chunks) > 10
    assert [e.name for c in chunks for e in c] == [e["name"] for e in events]


@pytest.mark.parametrize("content,problem", [
    (b"not gzip at all", "not gzip"),
    (gzip.compress(b'{"traceEvents": [')[:-6], "truncated"),
    (gzip.compress(b'{"a": 1}'), "no traceEvents"),
    (gzip.compress(b'{"traceEvents": [1,'), "not valid JSON"),
], ids=["not-gzip", "truncated-gzip", "not-a-trace", "truncated-json"])
def test_bad_trace_names_file_and_problem(tmp_path, content, problem):
    bad = tmp_path / "rank0.pt.trace.json.gz"
    bad.write_bytes(content)
    with pytest.raises(BadInput) as exc:
        merge_traces([bad], tmp_path / "m.json.gz")
    assert problem in str(exc.value) and str(bad) in str(exc.value)


def test_real_recorded_traces_merge(tmp_path):
    """Two ranks recorded by `ddpdoctor profile` (tests/fixtures/views/traces): every event kept, pid = rank."""
    traces = sorted((Path(__file__).parents[1] / "fixtures" / "views" / "traces").glob("*.pt.trace.json.gz"))
    assert len(traces) == 2
    out = merge_traces(traces, tmp_path / "merged.json.gz")
    ev = _load(out)["traceEvents"]
    source = [json.loads(gzip.decompress(p.read_bytes()))["traceEvents"] for p in traces]
    dropped = sum(1 for evs in source for e in evs if e.get("ph") == "M" and e["name"].startswith("process_"))
    added = sum(1 for e in ev if e.get("ph") == "M" and e["name"].startswith("process_"))
    assert len(ev) - added == sum(len(evs) for evs in source) - dropped
    assert {e["pid"] for e in ev} == {0, 1}
    assert sum(1 for e in ev if e.get("name") == "gloo:all_reduce") == sum(
        1 for evs in source for e in evs if e.get("name") == "gloo:all_reduce")


@pytest.mark.shared
def test_real_gpu_traces_keep_streams_apart(tmp_path):
    """Two ranks of a real NCCL job (../shared/traces/sampled_2rank): every pid of the trace carries the job's
    name, so GPU streams are labelled from Kineto's process_labels ("GPU 0"), never mixed with CPU threads."""
    folder = shared_path("traces", "sampled_2rank")
    traces = sorted(folder.glob("sampled_rank-*.json.gz"))
    out = merge_traces(traces, tmp_path / "merged.json.gz", {"0": 0.0, "1": 1.5})
    ev = _load(out)["traceEvents"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert {e["pid"] for e in kernels} == {0, 1}
    assert {e["tid"] for e in kernels if e["pid"] == 0} >= {"GPU 0: 7"}
    assert {e["tid"] for e in kernels if e["pid"] == 1} >= {"GPU 1: 7"}
    streams = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name" and e["pid"] == 0}
    assert "GPU 0 stream 7" in streams
    # CPU ops stay on their own (integer) thread ids
    assert all(isinstance(e["tid"], int) for e in ev if e.get("cat") == "cpu_op")
    src = [json.loads(gzip.decompress(p.read_bytes()))["traceEvents"] for p in traces]
    n_kernel = sum(1 for evs in src for e in evs if e.get("cat") == "kernel")
    assert len(kernels) == n_kernel
    first = {r: min(e["ts"] for e in src[r] if e.get("cat") == "kernel") for r in (0, 1)}
    assert min(e["ts"] for e in kernels if e["pid"] == 1) == pytest.approx(first[1] - 1.5)
    assert min(e["ts"] for e in kernels if e["pid"] == 0) == pytest.approx(first[0])


def test_trace_paths_of_run_dir_folder_and_files(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    a = _write(run / "traces" / "rank0.1.pt.trace.json.gz", _trace(0, 1, 0.0))
    (run / "report.json").write_text("{}")  # not a trace: a run directory's traces live in traces/
    folder = tmp_path / "f"
    folder.mkdir()
    b = _write(folder / "w.json", _trace(1, 2, 0.0))
    (folder / "notes.txt").write_text("x")
    c = _write(tmp_path / "rank2.json", _trace(2, 3, 0.0))
    assert trace_paths([run, folder, c]) == [a, b, c]

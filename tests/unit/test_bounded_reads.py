"""Hostile or damaged inputs to `analyze` and the run-directory loaders: one line naming the file, exit 2, fast."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import zlib
from pathlib import Path

import pytest

from ddpdoctor import safe_io
from ddpdoctor.errors import BadInput
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir.schema import Manifest, RankSummary
from ddpdoctor.traces.loader import load_raw
from tests.conftest import SAMPLE_RUN, run_cli

STEP = {"ph": "X", "name": "ProfilerStep#1", "cat": "user_annotation", "ts": 1, "dur": 2}


def _one_line(exc: BadInput, name: str) -> str:
    text = str(exc)
    assert "\n" not in text and name in text, text
    return text


@pytest.mark.parametrize("content,problem", [
    (b'{"traceEvents":[{"ph":"X","args":' + b"[" * 200_000 + b"]" * 200_000 + b"}]}", "nested too deeply"),
    (b"42", "got `int`"),
    (b'"hello"', "got `str`"),
    (json.dumps({"traceEvents": [{**STEP, "dur": -5}]}).encode(), "has duration -5.0"),
    (json.dumps({"traceEvents": [{**STEP, "ts": 1e308, "dur": 1e308}]}).encode(), "must be finite"),
    (b'{"traceEvents":[{"ph":"X","name":"x","ts":1,"dur":1e999}]}', "Number out of range"),
])
def test_bad_trace_content_is_one_line(tmp_path, content, problem):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(BadInput) as exc:
        from ddpdoctor.analyses.pipeline import analyze_paths

        analyze_paths([p])
    assert problem in _one_line(exc.value, "t.json")


def test_corrupt_gzip_names_the_byte_offset(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [STEP] * 2000}).encode()))
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0xFF
    p = tmp_path / "t.json.gz"
    p.write_bytes(bytes(data))
    with pytest.raises(BadInput) as exc:
        load_raw(p)
    assert "near byte" in _one_line(exc.value, "t.json.gz") or "truncated at byte" in str(exc.value)


def test_gzip_bomb_refused_after_a_few_megabytes(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_io, "GZIP_FREE_BYTES", 8 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(b"".join(c.compress(bytes(1 << 20)) for _ in range(64)) + c.flush())
    with pytest.raises(BadInput) as exc:
        load_raw(p)
    assert "gzip bomb" in _one_line(exc.value, "bomb.json.gz")


def test_cap_is_raised_by_flag(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps({"traceEvents": [STEP] * 30000}).encode())  # ~2 MB
    small = run_cli("analyze", str(p), env={"DDPDOCTOR_MAX_INPUT_MB": "1"})
    assert small.returncode == 2 and "exceeds the 1 MiB limit" in small.stderr and "Traceback" not in small.stderr
    raised = run_cli("analyze", str(p), "--max-input-mb", "8", env={"DDPDOCTOR_MAX_INPUT_MB": "1"})
    assert "exceeds" not in raised.stderr and "Traceback" not in raised.stderr


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_devices_fifos_and_directories_are_refused(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "zero.json.gz"
    link.symlink_to("/dev/zero")
    for path, what in ((fifo, "FIFO"), (link, "device"), (Path("/dev/zero"), "device")):
        with pytest.raises(BadInput) as exc:
            load_raw(path)
        assert what in _one_line(exc.value, path.name)


def test_no_profiler_step_is_a_trace_with_whole_trace_figures_and_advice(tmp_path):
    # A trace without steps (profiler without a schedule) is not bad input: whole-trace figures, and what per-step
    # figures would need (tests/unit/test_stepless_traces.py has the real traces).
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": 1, "dur": 5}]}))
    r = run_cli("analyze", str(p))
    assert r.returncode == 0 and "no-profiler-steps" in r.stdout and "prof.step()" in r.stdout
    assert "No findings" not in r.stdout


def test_json_depth_check_is_exact():
    assert safe_io.json_depth_ok(b"[" * 256 + b"]" * 256) is None
    assert safe_io.json_depth_ok(b"[" * 257 + b"]" * 257) == 256
    # brackets inside strings (with escaped quotes and backslashes) do not count
    inside = b'["' + b"[" * 300 + b'\\"\\\\' + b'"]'
    assert safe_io.json_depth_ok(inside) is None
    assert safe_io.json_depth_ok(b'{"a":"\\\\",' + b'"b":' + b"[" * 300 + b"]" * 300 + b"}") is not None


# ---- run-directory artefacts -----------------------------------------------------------------------------------

def _copy_run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_RUN, run)
    return run


def _edit(path: Path, fn) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(path.read_text())
    data = fn(data) or data
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("file,edit,problem", [
    ("manifest.json", lambda d: [1, 2], "expected a JSON object, got [1, 2]"),
    ("manifest.json", lambda d: d.update(ddp_modules={"x": []}), "ddp_modules: keys must be ranks"),
    ("manifest.json", lambda d: d["ddp_modules"]["0"][0].update(buckets="abc"),
     "ddp_modules[\"0\"][0].buckets: expected a list, got \"abc\""),
    ("manifest.json", lambda d: d["ranks"][1].update(rank="0x"), "ranks[1].rank: expected an integer, got \"0x\""),
])
def test_damaged_manifest_names_file_and_field(tmp_path, file, edit, problem):
    run = _copy_run(tmp_path)
    _edit(run / file, edit)
    r = run_cli("analyze", str(run))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{file}: {problem}" in r.stderr, r.stderr


def test_damaged_summary_names_field_and_falls_back_to_the_trace(tmp_path):
    run = _copy_run(tmp_path)
    summary = run / "ranks" / "rank1" / "summary.json"
    _edit(summary, lambda d: d["metrics"]["per_step"][2].update(start_us="x"))
    with pytest.raises(BadInput) as exc:
        artefacts.load(summary)
    assert str(exc.value) == 'ranks/rank1/summary.json: metrics.per_step[2].start_us: expected a number, got "x"'
    r = run_cli("analyze", str(run), "--json")
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any("summary.json: metrics.per_step[2].start_us" in n and "trace was read instead" in n for n in notes)


def test_old_run_directory_without_schema_version_loads():
    m = artefacts.load(SAMPLE_RUN / "manifest.json", Manifest)
    assert m.schema_version == 0 and m.world_size == 2 and sorted(m.ddp_modules) == [0, 1]
    s = artefacts.load(SAMPLE_RUN / "ranks" / "rank0" / "summary.json")
    assert isinstance(s, RankSummary) and s.metrics.steps > 0


def test_written_artefacts_carry_their_version_and_keep_unknown_fields(tmp_path):
    path = tmp_path / "ranks" / "rank0" / "status.json"
    artefacts.write_json(path, {"exit_code": 0, "a_new_field": {"x": 1}})
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == 1 and raw["a_new_field"] == {"x": 1}
    assert artefacts.load_dict(path)["a_new_field"] == {"x": 1}
    assert not list(path.parent.glob(".*.tmp"))


def test_full_disk_write_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "ranks" / "rank0" / "status.json"
    artefacts.write_json(path, {"exit_code": 0})
    monkeypatch.setenv("DDPDOCTOR_TEST_ENOSPC", "*/status.json")
    with pytest.raises(artefacts.DiskFull) as exc:
        artefacts.write_json(path, {"exit_code": 1})
    assert isinstance(exc.value, OSError) and isinstance(exc.value, BadInput)  # probes tolerate it, the CLI says it
    assert "No space left on device" in _one_line(exc.value, "status.json")
    assert json.loads(path.read_text())["exit_code"] == 0  # the earlier file is kept
    assert not list(path.parent.glob(".*.tmp"))

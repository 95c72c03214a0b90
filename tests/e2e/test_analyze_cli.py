"""`ddpdoctor analyze` end to end on a recorded 2-rank gloo run directory, trace files and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.unit.tracebuild import cpu_trace, write

FIXTURE = REPO / "tests" / "fixtures" / "analyze" / "gloo_2rank_mlp"


def _json(*args: str) -> dict:
    proc = run_cli("analyze", *args, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_run_dir_json_contract():
    d = _json(str(FIXTURE))
    assert (d["tool"], d["command"], d["window"]) == ("ddpdoctor", "analyze", "all")
    assert d["status"] in ("ok", "warning", "error")
    assert [r["rank"] for r in d["ranks"]] == [0, 1]
    for r in d["ranks"]:
        assert r["device"] == "cpu" and r["backend"] == "gloo" and r["world_size"] == 2
        assert r["step_ids"] == [3, 4, 5] and len(r["per_step"]) == 3
        assert 0 <= r["overlap_pct"] <= 100 and r["comm_us"] > 0 and r["compute_us"] > 0
        assert r["exposed_comm_us"] == pytest.approx(r["comm_us"] - r["overlap_us"])
        assert set(r["step_time_us"]) == {"median", "p90", "max"}
    col = d["collectives"]
    assert col["count"] == len(col["calls"]) > 0 and "all_reduce" in col["by_op"]
    # bucket_cap_mb=1 on a 12-layer MLP: several buckets per step, exactly one of them last.
    per_step = {}
    for b in col["buckets"]:
        per_step.setdefault((b["rank"], b["step"]), []).append(b)
    assert len(per_step) == 6 and all(len(v) > 1 and sum(x["is_last"] for x in v) == 1 for v in per_step.values())
    assert all(c["bytes"] and c["bytes"] % 4 == 0 for c in col["calls"])
    assert len(col["matched"]) == len(col["calls"]) // 2
    assert col["bandwidth"]["points"] == col["count"]
    assert set(d["stragglers"]["evidence"]["caused_wait_us"]) == {"0", "1"}
    assert d["ddp"] and d["ddp"][0]["bucket_cap_mb"] == 1.0 and d["ddp"][0]["buckets"]
    assert {i["rank_source"] for i in d["inputs"]} == {"distributedInfo"}


def test_summaries_and_reread_agree():
    a, b = _json(str(FIXTURE)), _json(str(FIXTURE), "--reread")
    for ra, rb in zip(a["ranks"], b["ranks"], strict=True):
        for k in ("compute_us", "comm_us", "overlap_us", "overlap_pct", "idle_us", "step_ids"):
            assert ra[k] == pytest.approx(rb[k]), k
    assert a["collectives"]["count"] == b["collectives"]["count"]


def test_trace_files_and_hta_window():
    files = sorted(str(p) for p in (FIXTURE / "traces").glob("*.gz"))
    d = _json(*files, "--window", "hta")
    assert d["window"] == "hta" and all(r["step_ids"] == [3, 4] for r in d["ranks"])


def test_terminal_output_exit_code():
    proc = run_cli("analyze", str(FIXTURE))
    assert proc.returncode in (0, 1) and "ddpdoctor analyze" in proc.stdout, proc.stderr


@pytest.mark.parametrize("content,problem", [('{"traceEvents": [{"ph": "X"', "truncated JSON"),
                                             ('{"a": 1}', "not a PyTorch profiler trace")])
def test_bad_file_one_line_exit_2(tmp_path: Path, content, problem):
    p = tmp_path / "t.json"
    p.write_text(content)
    proc = run_cli("analyze", str(p))
    assert proc.returncode == 2 and problem in proc.stderr and str(p) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_empty_dir_and_duplicate_ranks_exit_2(tmp_path: Path):
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "no profiler traces" in proc.stderr
    write(tmp_path / "a.json", cpu_trace(0))
    write(tmp_path / "b.json.gz", cpu_trace(0))
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "two traces claim rank 0" in proc.stderr


@pytest.mark.shared
def test_big_gpu_trace_read_on_every_core_reports_as_one_core(tmp_path: Path):
    """A big uncompressed GPU trace named on the command line is read by several processes started before the
    analyses are imported (traces/split.prefetch): the report is the one a single process writes."""
    import gzip

    from tests.conftest import shared_path

    gz = shared_path("traces", "a100_8gpu_rank3", "control.json.gz")
    path = tmp_path / "rank3.pt.trace.json"
    path.write_bytes(gzip.decompress(gz.read_bytes()))
    assert path.stat().st_size >= 32 << 20  # big enough to be split (traces/split.MIN_SPLIT_BYTES)
    one = _json(str(path), "--workers", "1")
    assert one["ranks"][0]["device"] == "gpu" and one["ranks"][0]["steps"] > 0
    assert _json(str(path), "--workers", "3") == one
    # Compressed: decompressed by one reading process started as early, which cuts it and reads its ranges.
    zipped = _json(str(gz), "--workers", "2")
    assert zipped["inputs"][0].pop("path") == str(gz) and one["inputs"][0].pop("path") == str(path)
    assert zipped == one

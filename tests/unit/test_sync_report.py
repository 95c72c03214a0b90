"""check-sync's report from a run directory: per-rank files, rank 0's gathered copy, and bad files."""

from __future__ import annotations

import json

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.loaders import rank_sync_records
from ddpdoctor.sync_api import sync_report

FP = [2.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]


def _record(rank: int, w) -> dict:
    return {"rank": rank, "world_size": 2, "stop_after": 1, "stopped_at": 1, "steps_completed": 1,
            "modules": [{"index": 0, "params": ["w"], "buffers": []}],
            "grads": [{"step": 0, "module": 0, "reduced": True, "fp": [FP]}],
            "params": [{"step": 0, "module": 0, "fp": [w]}], "buffers": [], "equivalence": None}


def _data(rank: int) -> dict:
    return {"rank": rank, "loaders": [], "init_conflicts": [], "set_epoch_calls": 0}


def test_ranks_of_another_node_come_from_rank0s_gathered_copy(tmp_path):
    run = RunDir(tmp_path)
    other = [2.0, 1.5, 1.25, 0.5, 1.0, 0.5, 0.5]
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    (tmp_path / "ranks" / "rank0" / "sync.json").write_text(json.dumps(_record(0, FP)))
    (tmp_path / "ranks" / "rank0" / "data.json").write_text(json.dumps(_data(0)))
    gathered = {str(r): {"sync": _record(r, FP if r == 0 else other), "data": _data(r)} for r in (0, 1)}
    (tmp_path / "ranks" / "rank0" / "sync-all.json").write_text(json.dumps(gathered))
    assert sorted(rank_sync_records(run)) == [0, 1]
    report = sync_report(run)
    (f,) = report.findings
    assert f.id == "param-divergence" and f.ranks == [1] and f.evidence["max_abs_diff"] == 0.5


def test_bad_sync_json_is_bad_input_naming_the_file(tmp_path):
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    bad = tmp_path / "ranks" / "rank0" / "sync.json"
    bad.write_text('{"rank": 0, "grads": [')
    with pytest.raises(BadInput, match="sync.json: not valid JSON"):
        sync_report(RunDir(tmp_path))
    bad.write_text("[1, 2]")
    with pytest.raises(BadInput, match="expected a JSON object"):
        sync_report(RunDir(tmp_path))


def test_no_records_is_a_note_not_a_finding(tmp_path):
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    report = sync_report(RunDir(tmp_path))
    assert report.findings == [] and "no rank wrote sync.json" in report.notes[0]

"""`aborted-after-finish` (docs/findings.md#job-aborted-after-finish) on a recorded run: both ranks of a real
2-rank gloo job wrote exit status 0 after 6 steps, then rank 1 printed "terminate called without an active
exception" and died of SIGABRT at interpreter exit; torchrun stopped rank 0 (SIGTERM) and exited 1. Before this
finding the report said `ok` with job exit 1 and nothing else: a silent contradiction.

The fixture (tests/fixtures/aborted_after_finish/) was recorded with
`ddpdoctor run --nproc-per-node 2 -q --json --out RUN tests/scenarios/abort_at_exit.py`, then trimmed (the lock,
report.json, live/, torchrun's per-attempt copies, ledgers and stacks removed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec

from ddpdoctor.findings.job import aborted_after_finish
from ddpdoctor.findings.model import Severity
from ddpdoctor.reports.run import assemble
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.schema import Manifest
from tests.teardown import settle

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "aborted_after_finish"


def _run(tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst)
    return dst


def _edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_recorded_teardown_abort_is_named(tmp_path: Path) -> None:
    report = assemble(RunDir(_run(tmp_path)), locked=False).to_json()
    assert report["status"] == "warning" and report["job"]["exit_code"] == 1
    (f,) = report["findings"]
    assert f["id"] == "aborted-after-finish" and f["severity"] == "warning" and f["ranks"] == [1]
    ev = f["evidence"]
    assert ev["signals"] == {"1": "SIGABRT"} and ev["steps_completed"] == {"1": 6}
    assert ev["last_words"] == {"1": "terminate called without an active exception"}
    assert ev["stopped_by_torchrun"] == [0] and ev["job_exit_code"] == 1
    assert "SIGABRT" in f["title"] and "6 steps" in f["title"] and "exit 1" in f["title"]


def test_shared_test_helper_forgives_exactly_this(tmp_path: Path) -> None:
    report = assemble(RunDir(_run(tmp_path)), locked=False)
    code, doc = settle(1, report)
    assert code == 0 and doc["status"] == "ok" and doc["findings"] == [] and doc["job"]["exit_code"] == 0
    assert settle(1, report, fail_on="warning")[0] == 0
    assert settle(2, report)[0] == 2  # bad input is never forgiven
    broken = report.to_json()
    broken["findings"].append({"id": "rank-crashed", "severity": "error", "ranks": [0], "evidence": {}})
    code, doc = settle(1, broken)
    assert code == 1 and doc["job"]["exit_code"] == 1 and len(doc["findings"]) == 2


def test_a_rank_that_failed_is_not_a_teardown_abort(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _edit(run / "ranks" / "rank1" / "status.json", exit_code=1)
    ids = [f.id for f in assemble(RunDir(run), locked=False).findings]
    assert "aborted-after-finish" not in ids


def test_a_rank_without_status_is_not_a_teardown_abort(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "ranks" / "rank1" / "status.json").unlink()
    ids = [f.id for f in assemble(RunDir(run), locked=False).findings]
    assert "aborted-after-finish" not in ids and "rank-crashed" in ids  # from its stderr: a crash of its own


def test_a_job_that_exited_0_or_was_stopped_has_no_such_finding(tmp_path: Path) -> None:
    run = _run(tmp_path)
    _edit(run / "manifest.json", exit_code=0, ended={"how": "exited", "exit_code": 0})
    assert assemble(RunDir(run), locked=False).findings == []
    _edit(run / "manifest.json", exit_code=1, ended={"how": "hang", "exit_code": 1}, killed_by="hang")
    assert "aborted-after-finish" not in [f.id for f in assemble(RunDir(run), locked=False).findings]


def test_either_source_names_the_rank(tmp_path: Path) -> None:
    run = _run(tmp_path)
    (run / "torchrun" / "torchrun.log").unlink()  # only the rank's own last words are left
    (f,) = assemble(RunDir(run), locked=False).findings
    assert f.ranks == [1] and f.evidence["signals"] == {"1": "SIGABRT"} and f.evidence["stopped_by_torchrun"] == []
    (run / "ranks" / "rank1" / "stderr.log").write_text("")  # and now nothing says which rank: no guess
    assert assemble(RunDir(run), locked=False).findings == []


def test_rule_by_hand() -> None:
    manifest = msgspec.convert({"exit_code": 1, "ended": {"how": "exited", "exit_code": 1}}, Manifest)
    ok = {"exit_code": 0, "steps_completed": 40}
    statuses = {0: dict(ok), 1: dict(ok), 2: dict(ok), 3: dict(ok, steps_completed=41)}
    # rank 2 aborted first; torchrun stopped 0, 1 and 3 with SIGTERM
    signals = {0: "SIGTERM", 1: "SIGTERM", 2: "SIGABRT", 3: "SIGTERM"}
    f = aborted_after_finish(manifest, statuses, signals, {2}, {})
    assert f is not None and f.severity is Severity.WARNING and f.ranks == [2]
    assert f.evidence["stopped_by_torchrun"] == [0, 1, 3] and f.evidence["steps_completed"] == {"2": 40}
    # two ranks aborted; the table names one root cause, the other died of SIGABRT too
    f = aborted_after_finish(manifest, statuses, {**signals, 3: "SIGABRT"}, {2}, {})
    assert f is not None and f.ranks == [2, 3] and f.title.startswith("Ranks 2 (SIGABRT), 3 (SIGABRT)")
    assert "its steps done" in f.title  # 40 and 41 steps
    assert aborted_after_finish(manifest, statuses, {}, set(), {}) is None
    assert aborted_after_finish(msgspec.structs.replace(manifest, exit_code=0), statuses, signals, {2}, {}) is None
    assert aborted_after_finish(manifest, {**statuses, 1: None}, signals, {2}, {}) is None

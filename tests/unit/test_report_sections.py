"""Typed report sections (issue 25, point 1): every command's report, saved as JSON, loads back as typed sections
(nothing left untyped) and serialises to the same document; the terminal view of a loaded report is the view of
the report as assembled."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from ddpdoctor.report import RawSection, Report
from ddpdoctor.reports.sections import (
    COMMAND_SECTIONS,
    JobSection,
    PerfSection,
    SyncChecksSection,
    load_report,
)

REPO = Path(__file__).resolve().parents[2]
GOLDEN = sorted((REPO / "tests" / "fixtures" / "golden").glob("*.json"))
RUNS = REPO / "tests" / "fixtures" / "golden_runs"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_saved_report_loads_back_typed_and_unchanged(path: Path) -> None:
    doc = json.loads(path.read_text())["json"]
    if "schema_version" not in doc:  # `status` prints a state object, not a report (reports/status.py)
        pytest.skip("not a report")
    report = load_report(doc)
    assert not [p for p in report.parts if isinstance(p, RawSection)], [type(p).__name__ for p in report.parts]
    assert {type(p) for p in report.parts} <= set(COMMAND_SECTIONS[doc["command"]])
    back = json.loads(json.dumps(report.to_json(), default=str))
    back["version"] = doc["version"]
    assert back == doc


def test_sections_are_found_by_type() -> None:
    doc = json.loads((REPO / "tests" / "fixtures" / "golden" / "check-sync-set-epoch.json").read_text())["json"]
    report = load_report(doc)
    job = report.section(JobSection)
    assert job is not None and job.job.exit_code == 0 and job.job.world_size == 2
    checks = report.section(SyncChecksSection)
    assert checks is not None and checks.checks["ranks"] == [0, 1]
    assert report.section(PerfSection) is None
    assert report.sections["job"]["world_size"] == 2  # the JSON-shaped view stays for older readers


def test_unknown_keys_are_kept_not_dropped() -> None:
    doc = {"tool": "ddpdoctor", "schema_version": 1, "version": "x", "command": "check-sync", "status": "ok",
           "run_dir": "r", "job": {"exit_code": 0}, "added_later": {"a": 1}, "findings": []}
    report = load_report(doc)
    assert report.to_json()["added_later"] == {"a": 1}
    assert report.to_json()["job"] == {"exit_code": 0, "world_size": None, "duration_s": None, "killed_by": None}


def _render(report: Report, sections) -> str:  # type: ignore[no-untyped-def]
    from ddpdoctor.renderers.console import render

    out = Console(record=True, width=140, highlight=False, soft_wrap=False)
    render(report, sections=sections, out=out)
    return out.export_text()


def test_a_saved_check_sync_report_renders_as_it_did(tmp_path: Path) -> None:
    from ddpdoctor.renderers.console_sync import render_sync_sections
    from ddpdoctor.reports.check_sync import assemble
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(shutil.copytree(RUNS / "sync_set_epoch", tmp_path / "run"))
    report = assemble(run, 0, locked=False)
    again = load_report(json.loads(json.dumps(report.to_json(), default=str)))
    text = _render(report, render_sync_sections)
    assert "Cross-rank comparisons" in text and "sampler-no-set-epoch" in text
    assert _render(again, render_sync_sections) == text

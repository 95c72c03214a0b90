"""The terminal view of a report is chosen by its section types (renderers/views.py): every recorded report gets
the view its command always had, and renders, saved and loaded back, without error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from ddpdoctor.renderers.console import render
from ddpdoctor.renderers.views import BY_COMMAND, view_for
from ddpdoctor.reports.sections import load_report

GOLDEN = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "golden").glob("*.json"))
REPORTS = [p for p in GOLDEN if "schema_version" in json.loads(p.read_text())["json"]]


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.stem)
def test_each_report_gets_its_commands_view_and_renders(path: Path) -> None:
    report = load_report(json.loads(path.read_text())["json"])
    view = view_for(report)
    expected = BY_COMMAND["check-sync"] if path.stem == "capture-check-sync" else BY_COMMAND[report.command]
    assert view is expected
    out = Console(record=True, width=160, highlight=False, soft_wrap=False)
    render(report, sections=view, verbose=True, out=out)
    text = out.export_text()
    assert text.startswith(f"ddpdoctor {report.command}: {report.status}")
    assert all(f.id in text for f in report.findings)

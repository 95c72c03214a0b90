"""`logs`'s report: the logs of a job that ran without ddpdoctor explained (inputs read, ranks seen, event
counts, the failure timeline, findings), with escape sequences cleaned."""

from __future__ import annotations

from collections.abc import Sequence

from ddpdoctor.report import Report, split_sections
from ddpdoctor.reports.sections import COMMAND_SECTIONS


def assemble(files: Sequence[str]) -> Report:
    from ddpdoctor.logs.explain import explain_paths
    from ddpdoctor.logs.sanitize import clean_report

    report = clean_report(explain_paths(files))
    return Report("logs", parts=split_sections(report.sections, COMMAND_SECTIONS["logs"]), findings=report.findings,
                  notes=report.notes)

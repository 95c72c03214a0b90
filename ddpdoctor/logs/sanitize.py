"""A report built from untrusted logs, made safe to print: every string of findings, sections and notes cleaned."""

from __future__ import annotations

from dataclasses import replace

from ddpdoctor.report import Report
from ddpdoctor.safe_io import clean_data, clean_text


def clean_report(report: Report) -> Report:
    """The same report with escape sequences and control characters neutralised (in place, and returned)."""
    report.findings = [replace(f, title=clean_text(f.title), advice=clean_text(f.advice),
                               evidence=clean_data(f.evidence)) for f in report.findings]
    report.sections = clean_data(report.sections)
    report.notes = [clean_text(n) for n in report.notes]
    return report

"""Terminal view of `preflight`'s checks table and bandwidth table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.report import Report
from ddpdoctor.reports.sections import PreflightSection, section_of

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}


def render_checks(report: Report, out: Console, verbose: bool) -> None:
    section = section_of(report, PreflightSection)
    if section is None:
        return
    table = Table(title="Preflight checks", expand=False)
    table.add_column("status")
    table.add_column("check")
    table.add_column("evidence", overflow="fold")
    for c in section.checks:
        style = STATUS_STYLE.get(c["status"], "")
        table.add_row(f"[{style}]{c['status']}[/]", escape(c["id"]), escape(c["summary"]))
    out.print(table)
    if section.bandwidth_table:
        out.print(escape(section.bandwidth_table), markup=True, highlight=False)
    out.print(f"[dim]run directory: {escape(str(section.run_dir))}; {section.duration_s} s[/dim]")

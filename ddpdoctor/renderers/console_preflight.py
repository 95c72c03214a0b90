"""Terminal view of `preflight`'s checks table and bandwidth table."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.report import Report

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}


def render_checks(report: Report, out: Console, verbose: bool) -> None:
    table = Table(title="Preflight checks", expand=False)
    table.add_column("status")
    table.add_column("check")
    table.add_column("evidence", overflow="fold")
    for c in report.sections["checks"]:
        style = STATUS_STYLE.get(c["status"], "")
        table.add_row(f"[{style}]{c['status']}[/]", escape(c["id"]), escape(c["summary"]))
    out.print(table)
    if report.sections.get("bandwidth_table"):
        out.print(escape(report.sections["bandwidth_table"]), markup=True, highlight=False)
    out.print(f"[dim]run directory: {escape(str(report.sections.get('run_dir')))}; "
              f"{report.sections.get('duration_s')} s[/dim]")

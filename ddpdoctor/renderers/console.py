"""The terminal view: the command's own sections, then findings by severity with evidence and advice."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.report import Report

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _evidence_line(evidence: dict[str, Any], limit: int = 240) -> str:
    parts = []
    for k, v in evidence.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        parts.append(f"{k}={text}")
    line = "; ".join(parts)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def render_findings(findings: list[Finding], out: Console, verbose: bool = False) -> None:
    if not findings:
        out.print("[green]No findings.[/green]")
        return
    table = Table(title="Findings", show_lines=False, expand=False)
    table.add_column("severity")
    table.add_column("id")
    table.add_column("ranks")
    table.add_column("what and what to do", overflow="fold")
    for f in sorted(findings, key=lambda f: -f.severity.rank):
        body = f"[bold]{escape(f.title)}[/bold]"
        if f.evidence:
            body += f"\n[dim]evidence: {escape(_evidence_line(f.evidence, 2000 if verbose else 240))}[/dim]"
        if f.advice:
            body += f"\n→ {escape(f.advice)}"
        ranks = ",".join(str(r) for r in f.ranks[:8]) + ("…" if len(f.ranks) > 8 else "")
        table.add_row(f"[{STYLE[f.severity]}]{f.severity.value}[/]", escape(f.id), ranks, body)
    out.print(table)


def render(
    report: Report,
    sections: Callable[[Report, Console, bool], None] | None = None,
    verbose: bool = False,
    out: Console | None = None,
) -> None:
    out = out or console()
    colour = {"ok": "green", "warning": "yellow", "error": "red"}[report.status]
    out.print(f"[bold]ddpdoctor {escape(report.command)}[/bold]: [{colour}]{report.status}[/{colour}]")
    if sections is not None:
        sections(report, out, verbose)
    for note in report.notes:
        out.print(f"[dim]note: {escape(note)}[/dim]")
    render_findings(report.findings, out, verbose)

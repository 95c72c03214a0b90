"""The terminal view: the command's own sections, then findings by severity with evidence and advice."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape

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


def _short_evidence(evidence: dict[str, Any], limit: int = 110) -> str:
    """The first few scalar facts of the evidence: enough to believe the title at a glance."""
    def simple(v: Any) -> bool:
        return isinstance(v, (int, float, str)) and not isinstance(v, bool) and len(str(v)) < 60

    parts = []
    for k, v in evidence.items():
        if simple(v):
            parts.append(f"{k}={v}")
        elif isinstance(v, dict) and v and len(v) <= 4 and all(simple(x) for x in v.values()):
            parts.append(f"{k}=" + "{" + ", ".join(f"{a}: {b}" for a, b in v.items()) + "}")
    lines = evidence.get("lines")
    if isinstance(lines, list) and lines and isinstance(lines[0], str):
        # The log line a finding rests on (topo, logs) is the evidence a reader wants: the first one, whole.
        more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
        return "; ".join(parts[:3] + [f"{lines[0][:200]}{more}"])
    line = "; ".join(parts[:4])
    return line if len(line) <= limit else line[: limit - 1] + "…"


def render_findings(findings: list[Finding], out: Console, verbose: bool = False) -> None:
    """Findings, worst first: severity, id, ranks and title on one line; the key evidence and the advice below.
    ``verbose`` prints the whole evidence."""
    if not findings:
        out.print("[green]No findings.[/green]")
        return
    out.print(f"[bold]Findings[/bold] ({len(findings)})")
    for f in sorted(findings, key=lambda f: -f.severity.rank):
        ranks = ""
        if f.ranks:
            shown = ",".join(str(r) for r in f.ranks[:8]) + ("…" if len(f.ranks) > 8 else "")
            ranks = f" [dim]ranks {shown}[/dim]"
        out.print(f"[{STYLE[f.severity]}]{f.severity.value:>7}[/] [bold]{escape(f.id)}[/bold]{ranks}: {escape(f.title)}")
        evidence = _evidence_line(f.evidence, 4000) if verbose else _short_evidence(f.evidence)
        if evidence:
            out.print(f"         [dim]evidence: {escape(evidence)}[/dim]")
        if f.advice:
            out.print(f"         → {escape(f.advice)}")


def render(
    report: Report,
    sections: Callable[[Report, Console, bool], None] | None = None,
    verbose: bool = False,
    out: Console | None = None,
) -> None:
    out = out or console()
    colour = {"ok": "green", "warning": "yellow", "error": "red"}.get(report.status, "magenta")  # stopped, interrupted
    why = f": {escape(str(report.stopped.get('message')))}" if report.stopped else ""
    out.print(f"[bold]ddpdoctor {escape(report.command)}[/bold]: [{colour}]{report.status}[/{colour}]{why}")
    if sections is not None:
        sections(report, out, verbose)
    for note in report.notes:
        out.print(f"[dim]note: {escape(note)}[/dim]")
    render_findings(report.findings, out, verbose)

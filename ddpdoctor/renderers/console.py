"""The terminal view: the command's own sections, then findings by severity with evidence and advice."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ddpdoctor.findings.model import Finding, Severity, ordered
from ddpdoctor.renderers.rank_classes import ranges_text
from ddpdoctor.report import Report

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def console() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _evidence_line(evidence: Mapping[str, object]) -> str:  # a finding's evidence map, only read
    """The whole evidence (--verbose): every key, nothing cut."""
    parts = []
    for k, v in evidence.items():
        text = v if isinstance(v, str) else json.dumps(v, default=str)
        parts.append(f"{k}={text}")
    return "; ".join(parts)


def _fact(v: object, depth: int = 0) -> str | None:
    """A compact rendering of one evidence value, or None when it is too big for the short view."""
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, (int, str, bool)) or v is None:
        text = str(v)
        return text if len(text) <= 200 else None
    if isinstance(v, dict) and v and depth < 2:
        items = list(v.items())
        inner = [f"{a}: {_fact(b, depth + 1)}" for a, b in items[:6] if _fact(b, depth + 1) is not None]
        more = f", … +{len(items) - 6}" if len(items) > 6 else ""
        return "{" + ", ".join(inner) + more + "}" if inner else None
    if isinstance(v, list) and v and len(v) <= 8 and all(isinstance(x, (int, float, str)) for x in v):
        return "[" + ", ".join(_fact(x, depth + 1) or "…" for x in v) + "]"
    return None


def _short_evidence(evidence: Mapping[str, object], max_facts: int = 6) -> str:
    """The facts a title rests on: measured values (nested per-rank values included) and, always, the thresholds
    they were compared with, each whole; the line wraps under a hanging indent instead of being cut."""
    parts: list[str] = []
    thresholds: list[str] = []
    for k, v in evidence.items():
        if k == "lines":
            continue
        fact = _fact(v)
        if fact is None:
            continue
        (thresholds if "threshold" in k or k.startswith(("min_", "max_allowed")) else parts).append(f"{k}={fact}")
    lines = evidence.get("lines")
    if isinstance(lines, list) and lines and isinstance(lines[0], str):
        # The log line a finding rests on (topo, logs) is the evidence a reader wants: the first one, whole.
        more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
        parts = parts[:3] + [f"{lines[0][:200]}{more}"]
    hidden = len(parts) - max_facts
    shown = parts[:max_facts] + thresholds
    return "; ".join(shown) + (f"; … {hidden} more (--verbose)" if hidden > 0 else "")


def render_findings(findings: list[Finding], out: Console, verbose: bool = False) -> None:
    """Findings, worst first: severity, id, ranks and title; the key evidence and the advice below, every line
    wrapped under a hanging indent. ``verbose`` prints the whole evidence."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=7, justify="right", no_wrap=True)
    grid.add_column(overflow="fold")
    if not findings:
        out.print("[green]No findings.[/green]")
        return
    out.print(f"[bold]Findings[/bold] ({len(findings)})")
    for f in ordered(findings):
        ranks = ""
        if f.ranks:
            shown = ranges_text(f.ranks, 24)  # 1,024 ranks read as "0-1023 (1024)"
            ranks = f" [dim]ranks {shown}[/dim]"
        grid.add_row(f"[{STYLE[f.severity]}]{f.severity.value}[/]",
                     f"[bold]{escape(f.id)}[/bold]{ranks}: {escape(f.title)}")
        evidence = _evidence_line(f.evidence) if verbose else _short_evidence(f.evidence)
        if evidence:
            grid.add_row("", f"[dim]evidence: {escape(evidence)}[/dim]")
        if f.advice:
            grid.add_row("", f"→ {escape(f.advice)}")
    out.print(grid)


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

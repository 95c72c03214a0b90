"""Terminal view of `logs`'s sections: the inputs it read, the failure timeline and the events it parsed."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from ddpdoctor.report import Report
from ddpdoctor.reports.sections import LogsSection, section_of


def render_logs_sections(report: Report, out: Any, verbose: bool) -> None:
    """The inputs read, then (--verbose) the failure timeline and the count of each kind of event."""
    section = section_of(report, LogsSection)
    if section is None:
        return
    table = Table(title="Inputs", show_lines=False, expand=False)
    for col in ("input", "kind", "lines", "ranks", "events"):
        table.add_column(col)
    for s in section.inputs or []:
        ranks = ",".join(str(r) for r in s["ranks"][:12]) + ("…" if len(s["ranks"]) > 12 else "")
        table.add_row(escape(s["name"]), s["kind"] if not s["problem"] else f"[yellow]{escape(s['problem'])}[/]",
                      str(s["lines"]), ranks, str(s["events"]))
    out.print(table)
    timeline = section.timeline or []
    if verbose and timeline:
        out.print("Failure lines, merged on their timestamps (first 20):")
        for t in timeline[:20]:
            who = f"rank {t['rank']}" if t["rank"] is not None else (t["host"] or "?")
            out.print(f"  {escape(t['where'])} [{escape(who)}] {escape(t['kind'])}: {escape(t['text'][:160])}")
    if verbose and section.events:
        out.print("events: " + escape(", ".join(f"{k}={v}" for k, v in sorted(section.events.items()))))

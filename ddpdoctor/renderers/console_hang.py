"""Terminal view of a watched run's hang section: when, the culprit, where each rank (or class of ranks) stood."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from ddpdoctor.report import Report


def render_hang_section(report: Report, out: Any, verbose: bool) -> None:
    """The hang section (typed, or the JSON shape of a report built before sections were typed)."""
    from ddpdoctor.reports.sections import HangSection, section_of

    section = section_of(report, HangSection)
    if section is None:
        return
    h = section.hang
    out.print(f"[bold red]hang[/bold red] detected after {h.detected_after_s} s without progress "
              f"(timeout {h.hang_timeout_s} s); culprit rank(s): {h.culprit_ranks or 'undetermined'}")
    for c in h.classes or []:
        out.print(f"  [{c.get('count')} rank(s): {escape(str(c.get('ranks')))} on node(s) {escape(str(c.get('nodes')))}] "
                  f"{escape(str(c.get('state')))}")
    for r, where in h.ranks.items() if not h.classes else ():
        out.print(f"  rank {escape(str(r))}: {escape(where)}")
    out.print(f"  stacks and Flight Recorder dumps: {escape(str(h.report))} / hang.json")

"""Which terminal view a report gets: chosen by the types of its sections (reports/sections.py), with the
command's own view where a report holds none of them (a run that recorded nothing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ddpdoctor.report import Report, Section

SectionView = Callable[[Report, Any, bool], None]


def _perf(report: Report, out: Any, verbose: bool) -> None:
    """The performance sections, then the diff against a baseline (`profile --baseline`) when there is one."""
    from ddpdoctor.renderers.console_perf import render_perf_sections

    render_perf_sections(report, out, verbose)
    _diff(report, out, verbose)


def _diff(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.diff_console import render_diff_section

    render_diff_section(report, out, verbose)


def _sync(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.console_sync import render_sync_sections

    render_sync_sections(report, out, verbose)


def _run(report: Report, out: Any, verbose: bool) -> None:
    """The hang section, then where the run directory is (as profile and check-sync end)."""
    from ddpdoctor.renderers.console_hang import render_hang_section
    from ddpdoctor.renderers.console_sync import print_run_dir

    render_hang_section(report, out, verbose)
    print_run_dir(report, out)


def _logs(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.console_logs import render_logs_sections

    render_logs_sections(report, out, verbose)


def _topo(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.console_topo import render_sections

    render_sections(report, out, verbose)


def _preflight(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.console_preflight import render_checks

    render_checks(report, out, verbose)


def _tune(report: Report, out: Any, verbose: bool) -> None:
    from ddpdoctor.renderers.console_tune import render_tune_section

    render_tune_section(report, out, verbose)


def _by_type() -> list[tuple[type[Section], SectionView]]:
    """The section types that decide a report's view, the most telling first."""
    from ddpdoctor.reports import sections as s

    return [(s.PerfSection, _perf), (s.SyncChecksSection, _sync), (s.PreflightSection, _preflight),
            (s.LogsSection, _logs), (s.TopoSection, _topo), (s.NcclUseSection, _topo), (s.HangSection, _run),
            (s.DiffSection, _diff), (s.TuneSection, _tune)]


# A report with none of those sections: the view its command always had.
BY_COMMAND: dict[str, SectionView] = {"analyze": _perf, "profile": _perf, "capture": _perf, "check-sync": _sync,
                                      "run": _run, "logs": _logs, "topo": _topo, "preflight": _preflight,
                                      "diff": _diff, "tune": _tune}


def view_for(report: Report) -> SectionView | None:
    for kind, view in _by_type():
        if report.section(kind) is not None:
            return view
    return BY_COMMAND.get(report.command)

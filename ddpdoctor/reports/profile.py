"""`profile`'s report once its job ended: the watched run (job, hang, crashes), the performance analysis of its
traces judged against how the run ended, what became of the profiled window, and `--nccl-debug`'s fabric checks."""

from __future__ import annotations

from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.probes.config import Schedule
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def assemble(run: RunDir, schedule: Schedule, nccl_debug: bool = False) -> Report:
    from ddpdoctor.findings.perf_verdict import apply_outcome, run_status_of
    from ddpdoctor.findings.watched import watched_report
    from ddpdoctor.findings.window import window_verdict

    report = watched_report(run, "profile", analyse_traces=True)
    report.findings = apply_outcome(report.findings, run_status_of(_manifest(run)))
    window_verdict(report, run, schedule)
    if nccl_debug:
        from ddpdoctor.reports.topo import add_run_topology

        report = add_run_topology(report, run)
    return report


def _manifest(run: RunDir) -> dict[str, Any] | None:
    from ddpdoctor.rundir import manifest as manifest_mod

    try:
        return manifest_mod.load(run)
    except (OSError, ValueError, BadInput):
        return None

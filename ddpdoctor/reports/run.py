"""`run`'s report once its job ended: the watched run (job, hang, crashes, --debug's log findings), the live step
health findings, what became of automatic capture windows, and `--nccl-debug`'s fabric checks."""

from __future__ import annotations

from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def assemble(run: RunDir, debug: bool = False, nccl_debug: bool = False) -> Report:
    from ddpdoctor.findings.watched import watched_report
    from ddpdoctor.live.capture import auto_capture_notes
    from ddpdoctor.live.findings import live_findings

    report = watched_report(run, "run", debug=debug)
    report.findings.extend(live_findings(run))
    report.notes.extend(auto_capture_notes(run.root))
    if nccl_debug:
        from ddpdoctor.reports.topo import add_run_topology

        report = add_run_topology(report, run)
    return report

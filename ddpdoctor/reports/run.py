"""`run`'s report once its job ended: the watched run (job, hang, crashes, --debug's log findings), the live step
health findings, what became of automatic capture windows, and `--nccl-debug`'s fabric checks."""

from __future__ import annotations

from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def assemble(run: RunDir, *, locked: bool, debug: bool = False, nccl_debug: bool = False) -> Report:
    """``locked``: a live ddpdoctor still holds the run directory (see reports/watched.py)."""
    from ddpdoctor.live.capture import auto_capture_notes
    from ddpdoctor.live.findings import ledger_notes, live_findings
    from ddpdoctor.reports.watched import watched_report

    watched = watched_report(run, "run", locked=locked, debug=debug)
    report = Report("run", parts=watched.parts, findings=[*watched.findings, *live_findings(run)],
                    notes=[*watched.notes, *ledger_notes(run), *auto_capture_notes(run.root)], stopped=watched.stopped)
    if nccl_debug:
        from ddpdoctor.reports.topo import add_run_topology

        report = add_run_topology(report, run)
    return report

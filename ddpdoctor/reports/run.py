"""`run`'s report once its job ended: the watched run (job, hang, crashes, --debug's log findings), the live step
health findings, what became of automatic capture windows, and `--nccl-debug`'s fabric checks."""

from __future__ import annotations

from ddpdoctor.job.role import NodeInfo
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def assemble(run: RunDir, *, locked: bool, debug: bool = False, nccl_debug: bool = False,
             node: NodeInfo | None = None) -> Report:
    """``locked``: a live ddpdoctor still holds the run directory (see reports/watched.py); ``node``: which node of
    a multi-node launch this is (the head: every node prints this report with its own ``node``)."""
    from ddpdoctor.live.capture import auto_capture_notes
    from ddpdoctor.live.findings import ledger_notes, live_findings
    from ddpdoctor.reports.sections import NodeSection
    from ddpdoctor.reports.watched import watched_report

    watched = watched_report(run, "run", locked=locked, debug=debug)
    parts = [*watched.parts, *([NodeSection(node.to_json())] if node is not None else [])]
    report = Report("run", parts=parts, findings=[*watched.findings, *live_findings(run)],
                    notes=[*watched.notes, *ledger_notes(run), *auto_capture_notes(run.root)], stopped=watched.stopped)
    if nccl_debug:
        from ddpdoctor.reports.topo import add_run_topology

        report = add_run_topology(report, run)
    return report

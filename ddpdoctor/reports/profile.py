"""`profile`'s report once its job ended: the watched run (job, hang, crashes), the performance analysis of its
traces judged against how the run ended, what became of the profiled window, `--nccl-debug`'s fabric checks, and
the diff against `--baseline`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import FAILURE_IDS, Finding
from ddpdoctor.job.role import NodeInfo
from ddpdoctor.probes.config import Schedule
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.records import RankStatusDoc
from ddpdoctor.rundir.schema import Manifest


def assemble(run: RunDir, schedule: Schedule, *, locked: bool, nccl_debug: bool = False,
             baseline: Path | None = None, node: NodeInfo | None = None) -> Report:
    """``locked``: a live ddpdoctor still holds the run directory (see reports/watched.py); ``baseline``: a run
    to diff this one against (reports/diff.py); ``node``: which node of a multi-node launch this is."""
    from ddpdoctor.findings.perf_verdict import apply_outcome, run_status_of
    from ddpdoctor.reports.sections import NodeSection
    from ddpdoctor.reports.watched import watched_report
    from ddpdoctor.rundir.loaders import rank_statuses

    watched = watched_report(run, "profile", locked=locked, analyse_traces=True)
    findings = apply_outcome(watched.findings, run_status_of(_manifest(run)))
    window, notes = window_parts(findings, rank_statuses(run), schedule, traced=bool(run.trace_files()))
    parts = [*watched.parts, *([NodeSection(node.to_json())] if node is not None else [])]
    report = Report("profile", parts=parts, findings=[*findings, *window], notes=[*watched.notes, *notes],
                    stopped=watched.stopped)
    if nccl_debug:
        from ddpdoctor.reports.topo import add_run_topology

        report = add_run_topology(report, run)
    if baseline is not None:
        from ddpdoctor.reports.diff import add_baseline

        report = add_baseline(report, baseline, run.root)
    return report


def window_parts(findings: list[Finding], statuses: dict[int, RankStatusDoc | None], schedule: Schedule,
                 traced: bool) -> tuple[list[Finding], list[str]]:
    """What `profile` says about its own window (docs/profile.md): a script that ended before the profiled steps
    (findings/window.py's rule), and ranks that stopped once the window was written."""
    from ddpdoctor.findings.window import window_finding

    done = {r: s for r, s in statuses.items() if isinstance(s, dict)}
    if not done:
        return [], []
    seen = min(int(s.get("steps_completed") or 0) for s in done.values())
    # A job that failed ended early because it failed: that finding says it, not the window.
    failed = any(f.id in FAILURE_IDS for f in findings) or any(s.get("exit_code") not in (0, None) for s in done.values())
    f = None if failed else window_finding(seen, schedule, sorted(done), traced)
    stopped: list[Any] = [s.get("stopped_after_window") for s in done.values() if s.get("stopped_after_window")]
    notes = [f"ranks stopped after the profiled window (iteration {max(stopped)}); `--run-to-completion` keeps "
             "training"] if stopped else []
    return ([f] if f is not None else []), notes


def _manifest(run: RunDir) -> Manifest | None:
    from ddpdoctor.rundir import manifest as manifest_mod

    try:
        return manifest_mod.load_typed(run)
    except (OSError, ValueError, BadInput):
        return None

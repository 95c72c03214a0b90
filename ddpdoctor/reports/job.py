"""The part every launch's report starts from: where the run directory is, how the job ended, and the job's own
findings (from the manifest and each rank's status.json)."""

from __future__ import annotations

from ddpdoctor.report import Report
from ddpdoctor.reports.sections import JobOutcome, JobSection, RunDirSection
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.loaders import rank_statuses


def job_report(run: RunDir, command: str, analyse_traces: bool) -> Report:
    """The run's traces analysed (``analyse_traces``: `profile`), then the run directory, the job and its
    findings."""
    from ddpdoctor.findings.job import disk_full_findings, job_findings

    manifest = manifest_mod.load_typed(run)
    statuses = rank_statuses(run)
    if analyse_traces and run.trace_files():
        from ddpdoctor.reports.analyze import assemble_run_dir

        base = assemble_run_dir(run, command)
    else:
        base = Report(command)
    job = JobOutcome(exit_code=manifest.exit_code, world_size=manifest.world_size, duration_s=manifest.duration_s,
                     killed_by=manifest.killed_by)
    said = {f.id for f in base.findings}  # the analysis may have said what the job built (parallelism) already
    return Report(command, parts=[*base.parts, RunDirSection(str(run.root)), JobSection(job)],
                  findings=[*base.findings, *(f for f in job_findings(manifest, statuses) if f.id not in said),
                                                     *disk_full_findings(manifest, statuses)], notes=base.notes)

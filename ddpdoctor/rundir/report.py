"""Builds the report of a finished launch from its run directory: the job's own findings plus the analyses."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.job import job_findings
from ddpdoctor.report import Report
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir, write_json


def rank_statuses(run: RunDir) -> dict[int, dict[str, Any] | None]:
    """Each rank's status.json (validated), or None for a rank that wrote none (killed by a signal). A status file
    that is there but damaged is bad input naming the file and field."""
    statuses: dict[int, dict[str, Any] | None] = {}
    for rank in run.ranks_present():
        path = run.rank_file(rank, "status.json")
        statuses[rank] = artefacts.load_dict(path) if path.exists() else None
    return statuses


def job_report(run: RunDir, command: str, analyse_traces: bool) -> Report:
    manifest = manifest_mod.load(run)
    statuses = rank_statuses(run)
    if analyse_traces and run.trace_files():
        from ddpdoctor.analyses.pipeline import analyze_run

        report = analyze_run(run)
        report.command = command
    else:
        report = Report(command=command)
    report.sections["run_dir"] = str(run.root)
    report.sections["job"] = {
        "exit_code": manifest.get("exit_code"),
        "world_size": manifest.get("world_size"),
        "duration_s": manifest.get("duration_s"),
        "killed_by": manifest.get("killed_by"),
    }
    report.findings.extend(job_findings(manifest, statuses))
    return report


def save_report(run: RunDir, report: Report) -> None:
    """RUN/report.json: the final report of a launch, written once, by the command that prints it."""
    write_json(run.root / "report.json", report.to_json())

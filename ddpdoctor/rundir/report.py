"""Saving a launch's final report into its run directory (RUN/report.json). Building it is ddpdoctor/reports/."""

from __future__ import annotations

from typing import Protocol

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.layout import RunDir, write_json
from ddpdoctor.rundir.loaders import rank_statuses

__all__ = ["rank_statuses", "save_report", "save_report_or_problem"]


class JsonDocument(Protocol):
    """What the run directory saves: anything that gives its JSON (a Report); rundir knows nothing above it."""

    def to_json(self) -> JsonObject: ...


def save_report(run: RunDir, report: JsonDocument) -> None:
    """RUN/report.json: the final report of a launch, written once, by the command that prints it."""
    write_json(run.root / "report.json", report.to_json())


def save_report_or_problem(run: RunDir, report: JsonDocument) -> str | None:
    """save_report, or the one line saying why it could not be written (a full disk): the command still prints the
    report and exits by the job's verdict, with that line as a warning (docs/trust.md, full disks)."""
    from ddpdoctor.errors import BadInput

    try:
        save_report(run, report)
    except (BadInput, OSError) as exc:
        return str(exc)
    return None

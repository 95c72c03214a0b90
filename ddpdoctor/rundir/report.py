"""Saving a launch's final report into its run directory (RUN/report.json). Building it is ddpdoctor/reports/."""

from __future__ import annotations

from typing import Protocol

from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.layout import RunDir, write_json
from ddpdoctor.rundir.loaders import rank_statuses

__all__ = ["rank_statuses", "save_report"]


class JsonDocument(Protocol):
    """What the run directory saves: anything that gives its JSON (a Report); rundir knows nothing above it."""

    def to_json(self) -> JsonObject: ...


def save_report(run: RunDir, report: JsonDocument) -> None:
    """RUN/report.json: the final report of a launch, written once, by the command that prints it."""
    write_json(run.root / "report.json", report.to_json())

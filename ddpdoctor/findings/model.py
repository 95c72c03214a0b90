"""The Finding record every rule produces and every renderer consumes, and the exit code it implies."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ddpdoctor.jsontypes import JsonObject


class Severity(str, enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"

    @property
    def rank(self) -> int:
        return {"info": 0, "warning": 1, "error": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    """One diagnosis. ``id`` is a stable contract (docs/findings.md); ``evidence`` holds plain JSON values."""

    id: str
    severity: Severity
    title: str
    ranks: list[int] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)  # a boundary: each rule's own evidence map, shown as JSON
    advice: str = ""

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "title": self.title,
            "ranks": list(self.ranks),
            "evidence": self.evidence,
            "advice": self.advice,
        }


class Stopped(TypedDict):
    """The report's "stopped" object (docs/json.md): ddpdoctor was stopped by a signal (findings/job.py
    ended_findings); it sets the status word and the exit code (128 + the signal's number)."""

    status: str  # "interrupted" | "stopped"
    signal: str
    exit_code: int
    message: str


# The job itself failed: these lead every view (failure first), before any other finding of any severity.
FAILURE_IDS = ("rank-crashed", "hang", "collective-mismatch", "job-interrupted", "job-stopped", "run-unfinished",
               "rank-no-status", "no-ranks-started")


def ordered(findings: Iterable[Finding]) -> list[Finding]:
    """The order every view shows findings in: the job's failures first, then by severity (stable otherwise)."""
    return sorted(findings, key=lambda f: (f.id not in FAILURE_IDS, -f.severity.rank))


def worst_severity(findings: Iterable[Finding]) -> Severity | None:
    worst: Severity | None = None
    for f in findings:
        if worst is None or f.severity.rank > worst.rank:
            worst = f.severity
    return worst


def status_word(findings: Iterable[Finding]) -> str:
    """The report's ``status``: "error", "warning", or "ok" (info findings do not raise it)."""
    worst = worst_severity(findings)
    if worst is Severity.ERROR:
        return "error"
    if worst is Severity.WARNING:
        return "warning"
    return "ok"


def exit_code(findings: Iterable[Finding], fail_on: Severity = Severity.ERROR) -> int:
    """0 when no finding reaches ``fail_on``, else 1. (2, bad input, is raised elsewhere.)"""
    worst = worst_severity(findings)
    return 1 if worst is not None and worst.rank >= fail_on.rank else 0

"""The Report every command returns: the JSON contract's envelope around command-specific sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpdoctor.findings.model import Finding, Severity, exit_code, status_word


@dataclass
class Report:
    """What a command found. ``sections`` holds the command's own JSON-ready data (e.g. "ranks",
    "collectives", "checks"); renderers read it, commands fill it."""

    command: str
    sections: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Set when ddpdoctor was stopped by a signal (findings/job.py ended_findings): {"status": "interrupted" or
    # "stopped", "signal", "exit_code": 128+signal, "message"}. It sets the status word and the exit code.
    stopped: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        if self.stopped:
            return str(self.stopped["status"])
        return status_word(self.findings)

    def exit_code(self, fail_on: Severity = Severity.ERROR) -> int:
        return exit_code(self.findings, fail_on)

    def to_json(self) -> dict[str, Any]:
        from ddpdoctor import __version__

        out: dict[str, Any] = {
            "tool": "ddpdoctor",
            "version": __version__,
            "command": self.command,
            "status": self.status,
        }
        if self.stopped:
            out["stopped"] = dict(self.stopped)
        out.update(self.sections)
        out["findings"] = [f.to_json() for f in sorted(self.findings, key=lambda f: -f.severity.rank)]
        if self.notes:
            out["notes"] = list(self.notes)
        return out

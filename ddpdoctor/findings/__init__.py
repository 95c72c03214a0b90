"""Findings: data that says what is wrong, with evidence and advice (see docs/findings.md)."""

from ddpdoctor.findings.model import Finding, Severity, exit_code, worst_severity

__all__ = ["Finding", "Severity", "exit_code", "worst_severity"]

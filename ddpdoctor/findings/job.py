"""Findings about how the launched job itself went: ranks that failed, no steps seen, no DDP found."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.model import Finding, Severity


def job_findings(manifest: dict[str, Any], statuses: dict[int, dict[str, Any] | None]) -> list[Finding]:
    """``statuses`` maps each rank to its status.json (None when the rank wrote none)."""
    findings: list[Finding] = []
    ranks = sorted(statuses)
    if not ranks:
        findings.append(Finding(
            "no-ranks-started", Severity.ERROR, "No rank started the script",
            evidence={"exit_code": manifest.get("exit_code")},
            advice="Read the launcher's output above: torchrun could not start the workers.",
        ))
        return findings
    silent = [r for r in ranks if statuses[r] is None]
    if silent:
        findings.append(Finding(
            "rank-no-status", Severity.ERROR, f"Rank(s) {silent} ended without a status (killed by a signal?)",
            ranks=silent, evidence={"exit_code": manifest.get("exit_code")},
            advice="A rank killed with SIGKILL writes nothing: check the OOM killer (dmesg) and the scheduler's logs.",
        ))
    done = {r: s for r, s in statuses.items() if s is not None}
    if done and all(s.get("steps_completed", 0) == 0 for s in done.values()) and all(
        s.get("exit_code") == 0 for s in done.values()
    ):
        findings.append(Finding(
            "no-steps-seen", Severity.WARNING, "No training iteration was seen: the script never stepped an optimizer",
            ranks=sorted(done), evidence={"steps_completed": 0},
            advice="Call ddpdoctor.step() at the end of each iteration (or wrap it in `with ddpdoctor.iteration():`); "
            "it is a no-op outside ddpdoctor.",
        ))
    if done and all(s.get("ddp_modules", 0) == 0 for s in done.values()):
        findings.append(Finding(
            "no-ddp", Severity.INFO, "No DistributedDataParallel module was built",
            ranks=sorted(done), evidence={"world_size": manifest.get("world_size"), "backend": manifest.get("backend")},
            advice="The job was profiled anyway; the DDP-specific analyses (buckets, overlap advice) do not apply.",
        ))
    return findings

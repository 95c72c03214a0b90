"""Findings about how the launched job itself went: ranks that failed, no steps seen, no DDP found."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.model import Finding, Severity, Stopped
from ddpdoctor.rundir.schema import Manifest


def job_findings(manifest: Manifest, statuses: dict[int, dict[str, Any] | None]) -> list[Finding]:
    """``statuses`` maps each rank to its status.json (None when the rank wrote none)."""
    findings: list[Finding] = []
    ranks = sorted(statuses)
    if not ranks:
        findings.append(Finding(
            "no-ranks-started", Severity.ERROR, "No rank started the script",
            evidence={"exit_code": manifest.exit_code},
            advice="Read the launcher's output above: torchrun could not start the workers.",
        ))
        return findings
    silent = [r for r in ranks if statuses[r] is None]
    if silent:
        findings.append(Finding(
            "rank-no-status", Severity.ERROR, f"Rank(s) {silent} ended without a status (killed by a signal?)",
            ranks=silent, evidence={"exit_code": manifest.exit_code},
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
            ranks=sorted(done), evidence={"world_size": manifest.world_size, "backend": manifest.backend},
            advice="The job was profiled anyway; the DDP-specific analyses (buckets, overlap advice) do not apply.",
        ))
    return findings


STOP_WORDS = {
    "SIGINT": ("interrupted", "Interrupted by the user (SIGINT)"),
    "SIGTERM": ("stopped", "Stopped by SIGTERM (preempted or time limit?)"),
    "SIGHUP": ("stopped", "Stopped by SIGHUP (the terminal or ssh session closed?)"),
    "SIGQUIT": ("stopped", "Stopped by SIGQUIT"),
}


def ended_findings(manifest: Manifest, locked: bool) -> tuple[list[Finding], Stopped | None]:
    """How the run ended, from the manifest's ``ended``: a signal to ddpdoctor is a fact of the run (status
    "interrupted" or "stopped", exit 128+signal), not an error of the job; a manifest still "running" in an unlocked
    run directory belongs to a ddpdoctor that was killed (SIGKILL) or crashed. Returns (findings, Report.stopped)."""
    ended = manifest.ended
    if ended is None:
        return [], None
    how = ended.how
    if how == "signal":
        name = str(ended.signal)
        raw = ended.signum
        signum = raw if raw is not None and 0 < raw < 64 else 15
        status, headline = STOP_WORDS.get(name, ("stopped", f"Stopped by {name}"))
        stopped: Stopped = {"status": status, "signal": name, "exit_code": 128 + signum, "message": headline}
        return [Finding(
            "job-stopped", Severity.WARNING,
            f"{headline}: ddpdoctor stopped the job; what was recorded until then is kept",
            evidence={"signal": name, "exit_code": 128 + signum, "duration_s": manifest.duration_s},
            advice="The ranks' errors after the stop (KeyboardInterrupt, SIGTERM, connection closed) follow from it. "
                   "Findings about performance rest on the steps recorded before the stop; "
                   "`ddpdoctor analyze` reads the run directory as it is.",
        )], stopped
    if how == "running" and not manifest.finished and not locked:
        return [Finding(
            "run-unfinished", Severity.WARNING,
            "ddpdoctor ended without finishing this run (killed with SIGKILL, or it crashed); the job was stopped "
            "with it",
            evidence={"started_at": manifest.started_at},
            advice="What the ranks wrote before that is kept; rerun to get a complete report.",
        )], None
    if how == "ddpdoctor-error":
        return [Finding(
            "run-unfinished", Severity.ERROR, f"ddpdoctor itself failed during the run: {ended.error}",
            evidence={"error": ended.error},
            advice="The job was stopped so that it does not run on unwatched; please report this error.",
        )], None
    return [], None

"""Findings about how the launched job itself went: ranks that failed, no steps seen, no DDP found."""

from __future__ import annotations

from collections.abc import Mapping

from ddpdoctor.findings.model import Finding, Severity, Stopped
from ddpdoctor.rundir.records import RankStatusDoc
from ddpdoctor.rundir.schema import Manifest


def job_findings(manifest: Manifest, statuses: Mapping[int, RankStatusDoc | None]) -> list[Finding]:
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
    if silent and manifest.disk_full and manifest.exit_code == 0:
        silent = []  # the job succeeded and the disk was full: their status did not fit (disk-full names them)
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
    from ddpdoctor.findings.parallelism import parallelism_findings

    # What else than DDP the ranks built: an FSDP or tensor-parallel job gets its own word, never `no-ddp`.
    kinds = {k for s in done.values() for k in s.get("parallelism", [])}
    other = parallelism_findings(manifest, kinds)
    findings.extend(other)
    if done and not other and all(s.get("ddp_modules", 0) == 0 for s in done.values()):
        findings.append(Finding(
            "no-ddp", Severity.INFO, "No DistributedDataParallel module was built",
            ranks=sorted(done), evidence={"world_size": manifest.world_size, "backend": manifest.backend},
            advice="The job was profiled anyway; the DDP-specific analyses (buckets, overlap advice) do not apply.",
        ))
    return findings


def disk_full_findings(manifest: Manifest, statuses: Mapping[int, RankStatusDoc | None]) -> list[Finding]:
    """`disk-full`: the disk under the run directory filled during the run (the manifest's ``disk_full``, written
    by the launcher from rundir/reserve.py): when, what ddpdoctor could not write, the ranks whose status.json is
    missing (from a job that exited 0: the status did not fit; else rank-no-status says they may have been killed)."""
    facts = manifest.disk_full
    if not isinstance(facts, dict):
        return []
    unwritten = [u for u in facts.get("unwritten") or [] if isinstance(u, dict)]
    missing = sorted(r for r, s in statuses.items() if s is None)
    after = facts.get("full_after_s")
    when = f"{after:g} s into the run" if isinstance(after, (int, float)) else "during the run"
    lacks = [str(u.get("path")) for u in unwritten][:8]
    if missing:
        lacks.append(f"status.json of rank(s) {missing}")
    # torchrun writes the ranks' logs itself: they may be cut short at that moment whatever ddpdoctor could write.
    what = ("; it lacks " + ", ".join(lacks) if lacks else
            "; ddpdoctor's own files fitted, but the ranks' logs (torchrun writes them) may be cut short there")
    code = manifest.exit_code
    return [Finding(
        "disk-full", Severity.WARNING,
        f"The disk under the run directory filled {when} (No space left on device){what}",
        ranks=missing,
        evidence={"full_after_s": after, "min_free_bytes": facts.get("min_free_bytes"), "unwritten": unwritten,
                  "ranks_without_status": missing, "job_exit_code": code,
                  "reserve_bytes": facts.get("reserve_bytes"), "reserve_short": facts.get("reserve_short")},
        advice="The job's own verdict is the exit code; this run directory is incomplete where listed (rank logs "
               "that did not fit stay under RUN/torchrun/), and `ddpdoctor analyze` reads what is there. Free space "
               "or put --out on a disk with room (the job's checkpoints and ddpdoctor's run directory share this "
               "one).",
    )]


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
            "ddpdoctor ended without finishing this run's record (killed with SIGKILL, crashed, or the disk was full "
            "when it wrote the end); a job still running then was stopped with it",
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


# The C++ runtime's last words when a thread or a destructor calls std::terminate during interpreter teardown
# (libstdc++'s verbose terminate handler); torch 2.13's gloo sometimes ends a finished rank this way.
TERMINATE_MARK = "terminate called"


def aborted_after_finish(manifest: Manifest, statuses: Mapping[int, RankStatusDoc | None],
                         signals: dict[int, str], root_causes: set[int],
                         last_words: dict[int, str]) -> Finding | None:
    """Every rank finished its script and wrote exit status 0, yet the job's exit code is not 0 because a rank died
    of a signal afterwards, at interpreter teardown. ``signals``: rank -> the signal torchrun's failure table names
    for it; ``root_causes``: the ranks that table calls the first failure; ``last_words``: rank -> the
    "terminate called ..." line of its stderr. The ranks that aborted are the first failure(s) and any rank that
    died of a signal other than the SIGTERM torchrun sends the others when one worker ends, or that printed the
    terminate line; the rest torchrun stopped. None when the data do not show exactly this."""
    code = manifest.exit_code
    how = (manifest.ended.how if manifest.ended else None) or "exited"
    if not isinstance(code, int) or code == 0 or how != "exited" or manifest.killed_by:
        return None
    if not statuses or any(s is None or s.get("exit_code") != 0 for s in statuses.values()):
        return None  # a rank that failed (or wrote nothing) is a failure of its own, with its own finding
    aborted = sorted(r for r in statuses if (r in signals and (r in root_causes or signals[r] != "SIGTERM"))
                     or r in last_words)
    if not aborted:
        return None  # the job failed after every rank said 0, and nothing says which rank or why: no guess
    stopped = sorted(r for r in signals if r in statuses and r not in aborted)
    sigs = {r: signals.get(r) or ("SIGABRT" if r in last_words else None) for r in aborted}
    steps = {r: (statuses[r] or {}).get("steps_completed") for r in aborted}
    named = ", ".join(f"{r} ({sigs[r] or 'a signal'})" for r in aborted)
    said = next((last_words[r] for r in aborted if r in last_words), None)
    step_words = sorted({s for s in steps.values() if isinstance(s, int)})
    done = f"all {step_words[0]} steps done" if len(step_words) == 1 else "its steps done"
    return Finding(
        "aborted-after-finish", Severity.WARNING,
        f"Rank{'s' if len(aborted) > 1 else ''} {named} died at interpreter exit, after finishing the script with exit status 0 ({done})"
        + (f': "{said}"' if said else "") + f"; torchrun then reported the job failed (exit {code})",
        ranks=aborted,
        evidence={"signals": {str(r): s for r, s in sigs.items()}, "steps_completed": {str(r): s for r, s in steps.items()},
                  "last_words": {str(r): w for r, w in last_words.items() if r in aborted},
                  "stopped_by_torchrun": stopped, "job_exit_code": code},
        advice="The training itself completed on every rank (each reported exit status 0 after its last step); the "
               "process died afterwards, while Python and torch tore down (torch 2.13's gloo has been seen to abort "
               "so in plain torchrun jobs too, with \"terminate called without an active exception\"). The exit "
               "code is torchrun's and ddpdoctor keeps it: a scheduler or script that reads it sees a failure. "
               "Check that the job's outputs (checkpoints) were written before retrying; if it recurs, report it to "
               "PyTorch with the rank's stderr.log.",
    )

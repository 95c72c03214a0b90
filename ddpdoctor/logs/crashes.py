"""Crash findings from logs: which rank really died first (rank-crashed), whether torchrun's "root cause" is a
victim (misleading-root-cause), and a failed job the logs cannot explain (job-failed)."""

from __future__ import annotations

from ddpdoctor.findings.failure import rank_crashed_finding
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.logs.events import ChildFailure, RankException
from ddpdoctor.logs.rules import STACK_LIMIT, classify

_CLEANUP_SIGNALS = {"SIGTERM", "SIGINT", "SIGHUP"}  # what torchrun / the scheduler send to the survivors
_SIGNAL_ADVICE = {
    "SIGKILL": "SIGKILL is usually the kernel's OOM killer or the scheduler (memory or time limit): check "
               "`dmesg`/`journalctl -k` for 'Out of memory' and the scheduler's accounting (sacct MaxRSS).",
    "SIGSEGV": "A native crash (segmentation fault) in torch, an extension or a library: the faulthandler stack "
               "(PYTHONFAULTHANDLER=1) shows the Python line; try the same step on one process.",
    "SIGABRT": "The process aborted: a C++ exception nobody caught (terminate) or NCCL's watchdog tearing it down.",
    "SIGBUS": "A bus error: often /dev/shm too small for DataLoader workers (docker --shm-size) or a bad mmap.",
}


def crashed_ranks(exceptions: list[RankException], failures: list[ChildFailure],
                  other_problem: bool) -> dict[int | None, tuple[str, str, str, str | None]]:
    """Rank -> (exception, traceback, call site, signal) for every rank that failed on its own, in the order seen."""
    crashed: dict[int | None, tuple[str, str, str, str | None]] = {}
    native: list[RankException] = []
    for exc in exceptions:
        if exc.chained or classify(exc) != "crash":
            continue
        if exc.exc_type == "Fatal Python error" and exc.rank is None:
            native.append(exc)  # faulthandler output carries no rank: matched with the launcher's signals below
            continue
        if exc.rank not in crashed:
            frame = exc.user_frame()
            crashed[exc.rank] = (exc.exception, exc.traceback[:STACK_LIMIT], str(frame) if frame else "", None)
    if None in crashed:
        # An unprefixed traceback: it belongs to the one rank the launcher saw exit with an error, if only one did.
        candidates = {f.rank for f in failures if f.exitcode and f.exitcode > 0 and f.rank not in crashed}
        if len(candidates) == 1 and None not in candidates:
            crashed[candidates.pop()] = crashed.pop(None)
    signalled = [f for f in failures if f.signal and f.signal not in _CLEANUP_SIGNALS]
    # SIGABRT on every failing rank is NCCL's watchdog tearing the job down, not N independent crashes.
    all_aborted = len(signalled) > 1 and all(f.signal == "SIGABRT" for f in signalled)
    # A rank whose own error says a peer went away (gloo::IoException, Connection reset) and then aborted: the abort
    # is how it died of its peer's death, not a crash of its own.
    victims = {e.rank for e in exceptions if e.rank is not None and classify(e) == "victim"}
    for f in signalled:
        if f.rank in crashed or (f.signal == "SIGABRT" and f.rank in victims):
            continue
        if f.signal == "SIGABRT" and (other_problem or all_aborted):
            continue  # NCCL's watchdog / a gloo enforce already explained by another finding
        stack = native[0].traceback if native and len({n.traceback.split("\n", 2)[-1] for n in native}) == 1 else ""
        exception = f"Signal {f.signal}" + (f" ({native[0].exception})" if stack else "")
        if f.reporter == "oom":
            exception = f"killed by the OOM killer: {f.error}"
        crashed[f.rank] = (exception, stack or f.error, "", f.signal)
    return crashed


_HOST_WIDE = {
    "SIGBUS": "several ranks of one host dying of SIGBUS at once is the host's shared memory running out (/dev/shm: "
              "docker --shm-size, or fewer DataLoader workers), not one rank's fault",
    "SIGKILL": "several ranks killed in the same second is the kernel's OOM killer or the scheduler acting on the "
               "whole host or job (dmesg, sacct), not one rank's fault",
}  # (a SIGSEGV or SIGABRT of several ranks keeps one finding per rank: each has its own stack to show)


def _same_moment(crashed: dict[int | None, tuple[str, str, str, str | None]], signals: dict[int, str],
                 failures: list[ChildFailure]) -> list[tuple[str, str, list[int], str | None]]:
    """Groups of 2+ ranks the launcher saw die of one signal in the same second: (signal, time, ranks, host)."""
    when = {f.rank: (f.time, f.host) for f in failures if f.rank is not None and f.time}
    groups: dict[tuple[str, str], list[int]] = {}
    for rank, (_, _, _, signal) in crashed.items():
        signal = signal or (signals.get(rank) if rank is not None else None)
        if rank is None or signal not in _HOST_WIDE or rank not in when:
            continue
        groups.setdefault((signal, when[rank][0] or ""), []).append(rank)
    return [(sig, t, sorted(ranks), when[ranks[0]][1]) for (sig, t), ranks in groups.items() if len(ranks) > 1]


def crash_findings(crashed: dict[int | None, tuple[str, str, str, str | None]],
                   signals: dict[int, str], failures: list[ChildFailure] | None = None) -> list[Finding]:
    findings = []
    grouped: set[int] = set()
    for sig, time, ranks, host in _same_moment(crashed, signals, failures or []):
        grouped |= set(ranks)
        findings.append(rank_crashed_finding(
            None,
            f"Ranks {', '.join(map(str, ranks))} all died of {sig} at {time}" + (f" on {host}" if host else "")
            + ": one cause shared by the host, not one rank's fault",
            _SIGNAL_ADVICE.get(sig, "Look at what the host did at that second (dmesg, the scheduler)."),
            ranks=ranks, culprit_ranks=ranks, signal=sig, time=time, host=host,
            exception=f"Signal {sig}", traceback=crashed[ranks[0]][1], call_site=None,
            why=_HOST_WIDE.get(sig, "several ranks dying of one signal in the same second share one cause"),
        ))
    for rank, (exception, traceback, site, signal) in crashed.items():
        if rank in grouped:
            continue
        signal = signal or (signals.get(rank) if rank is not None else None)
        advice = _SIGNAL_ADVICE.get(signal or "", "Fix this rank's error first: the other ranks' errors (Connection "
                                    "closed/reset by peer, timeouts, watchdog aborts) are consequences of it.")
        if signal is None and "out of memory" in exception.lower():
            advice = ("The rank ran out of memory: a bigger batch or sequence on this rank than on the others (uneven "
                      "data), a leak across steps, or too little memory for the model; check the batch shapes here.")
        first_line = exception.splitlines()[0] if exception else "?"
        findings.append(rank_crashed_finding(
            rank, f"Rank {rank if rank is not None else '?'} crashed: {first_line[:200]}",
            exception=exception, traceback=traceback, call_site=site or None, advice=advice,
        ))
    return findings


def root_cause_findings(failures: list[ChildFailure], culprits: set[int],
                        exceptions: dict[int, list[RankException]]) -> list[Finding]:
    findings = []
    for f in failures:
        if not f.is_root_cause or f.rank is None or not culprits or f.rank in culprits:
            continue
        own = exceptions.get(f.rank, [])
        error = own[0].exception if own else (f.error or f"exit code {f.exitcode}")
        findings.append(Finding(
            "misleading-root-cause", Severity.WARNING,
            f"torchrun's 'root cause' rank {f.rank} is a victim; the culprit is rank(s) {sorted(culprits)}",
            ranks=[f.rank, *sorted(culprits)],
            evidence={"reported_rank": f.rank, "reported_error": error.splitlines()[0] if error else "",
                      "culprit_ranks": sorted(culprits), "where": str(f.where)},
            advice="torchrun names the first rank it saw exit, not the first that failed: a rank that waits on a dead "
                   "or stuck peer exits first with a timeout or 'Connection closed by peer'. Start from the culprit.",
        ))
    return findings


def job_failed_finding(failures: list[ChildFailure]) -> list[Finding]:
    if not failures:
        return []
    root = next((f for f in failures if f.is_root_cause), failures[0])
    signals = {f.signal for f in failures if f.signal}
    hint = (" Every failing rank got SIGABRT: that is what NCCL's watchdog does after a collective timeout "
            "(look for 'Watchdog caught collective operation timeout' in the ranks' own logs)."
            if signals == {"SIGABRT"} else "")
    return [Finding(
        "job-failed", Severity.ERROR,
        f"The job failed (rank {root.rank}: {root.signal or f'exit code {root.exitcode}'}) and these logs do not say why",
        ranks=sorted({f.rank for f in failures if f.rank is not None}),
        evidence={"failures": [{"rank": f.rank, "exitcode": f.exitcode, "signal": f.signal, "host": f.host,
                                "root_cause": f.is_root_cause, "error": f.error[:500]} for f in failures],
                  "reported_root_cause_rank": root.rank},
        advice="Give ddpdoctor every rank's output (torchrun --tee 3 or --log-dir, srun --label), or decorate the "
               "entrypoint with @torch.distributed.elastic.multiprocessing.errors.record so torchrun's table carries "
               "each rank's traceback." + hint,
    )]

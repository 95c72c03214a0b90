"""Crash diagnosis: which rank's failure is the root cause, from the ranks' status files, their stderr and last
heartbeats (pure functions); the others' errors are victims, listed and never blamed.

Findings: ``rank-crashed`` (built by findings/failure.py), ``rank-left-early``, ``unused-parameters``, and
``collective-mismatch`` when an exception says so (docs/findings.md)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import TypedDict

from ddpdoctor.findings.failure import rank_crashed_finding
from ddpdoctor.findings.framework_advice import ddp_option, framework_of
from ddpdoctor.findings.hang import DDP_BUCKETS, AbortedRank, GlooSizes, mismatch_finding, position
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.rundir.records import Beat, CollectiveState, RankStatusDoc
from ddpdoctor.rundir.schema import DDPModule

# A rank whose exception says one of these failed because a peer went away or the job was torn down.
VICTIM_PATTERNS = (
    "Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
    "Timed out waiting", "Socket Timeout", "watchdog", "communicator was aborted", "NCCL Error 6",
    "ProcessGroupNCCL is aborted", "SIGTERM", "KeyboardInterrupt", "SystemExit",
)
MISMATCH_PATTERNS = ("Received data size doesn't match", "Detected mismatch between collectives")
_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): ([^\n]+)")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")
# Lightning 2.x (DDPStrategy.on_exception) replaces DDP's message, and with it the list of parameters.
_UNUSED_LIGHTNING = re.compile(r"It looks like your LightningModule has parameters that were not used in producing")


def is_victim(exception: str) -> bool:
    return any(p.lower() in exception.lower() for p in VICTIM_PATTERNS)


_TERMINATE = re.compile(r"terminate called after throwing an instance of '([^']+)'\n\s*what\(\):\s*(.+)")
_GLOO_SIZES = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match")
_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)
_FH_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)', re.M)


class FatalError(TypedDict):
    """What the stderr of a rank that died without a Python exception says (fatal_error)."""

    exception: str
    traceback: str
    call_site: str | None
    op: str | None  # the public torch.distributed function it was in


def fatal_error(stderr: str) -> FatalError | None:
    """A rank that died without a Python exception (C++ abort, segfault): what its stderr says.

    Returns {"exception", "traceback", "call_site"} from the C++ "terminate called ... what():" line and
    Python's faulthandler block ("Fatal Python error: ..." then the current thread's frames)."""
    fatal = _FATAL.search(stderr)
    term = _TERMINATE.search(stderr)
    if not fatal and not term:
        return None
    exception = f"{term.group(1)}: {term.group(2).strip()}" if term else f"Fatal Python error: {fatal.group(1)}"  # type: ignore[union-attr]
    tb = stderr[fatal.start():] if fatal else ""
    tb = tb.split("\nExtension modules:")[0].strip()
    # faulthandler lists threads newest first: the last block with frames is the main thread.
    blocks = [b for b in re.split(r"\n(?=(?:Current thread|Thread) 0x)", tb) if _FH_FRAME.search(b)]
    frames = _FH_FRAME.findall(blocks[-1]) if blocks else []
    call_site = next((f"{p}:{n}" for p, n, _ in frames if _is_user_file(p)), None)
    # The public torch.distributed function it was in: the outermost frame of distributed_c10d.py.
    ops = [fn for p, _, fn in frames if p.endswith("distributed_c10d.py")]
    return {"exception": exception, "traceback": tb, "call_site": call_site, "op": ops[-1] if ops else None}


def _is_user_file(path: str) -> bool:
    if path.startswith("<") or "/torch/" in path or "/ddpdoctor/" in path:
        return False
    return "site-packages" in path or "/lib/python3" not in path


def _beat_collective(rank: int, last_beats: Mapping[int, Beat | None] | None, ddp: bool = True) -> CollectiveState:
    """The collective (DDP's bucket all-reduce for a rank in backward() of a DDP job) the rank's last heartbeat shows
    it in."""
    p = position(rank, (last_beats or {}).get(rank), None, ddp)
    return {"op": p.op, "group": p.group, "seq": p.seq, "sizes": p.sizes, "call_site": p.call_site} if p.op else {}


class FailedRank(RankStatusDoc, total=False):
    """A failed rank as crash_findings weighs it: its status, or what its stderr or a signal says; ``died``: the
    process died (no Python exception of its own)."""

    died: bool


def crash_findings(statuses: Mapping[int, RankStatusDoc | None], debug: bool = False,
                   param_names: dict[int, list[str]] | None = None,
                   stderr: dict[int, str] | None = None,
                   last_beats: Mapping[int, Beat | None] | None = None,
                   torn_down: set[int] | None = None, ddp_cfg: DDPModule | None = None,
                   oom_kills: int | None = None,
                   first_signalled: Mapping[int, str] | None = None, ddp: bool = True) -> list[Finding]:
    """rank-crashed for the root cause(s), collective-mismatch when the exception says so, and
    unused-parameters from DDP's "did not receive grad" error. Victims are listed, never blamed.

    ``stderr`` (rank -> its stderr text) explains ranks that died without a status file; their last
    heartbeat (``last_beats``) says which collective they were in. ``torn_down``: ranks torchrun itself stopped
    after another rank ended (its "Sending process PID closing signal"), victims when they left no status.
    ``oom_kills``: how many times the host's OOM killer fired during the job (/proc/vmstat, None: not known), which
    tells a rank killed outright by the OOM killer from one killed by another SIGKILL. ``first_signalled``: rank ->
    signal of torchrun's first observed failure(s) (its failure table's root cause). ``ddp``: False when the job
    built no DDP module (FSDP2, DTensor): nothing is read as DDP's bucket all-reduce then."""
    torn_down = torn_down or set()
    failed: dict[int, FailedRank] = {r: {**s} for r, s in statuses.items() if s and s.get("exception")}
    for r, s in statuses.items():
        if s is None and stderr and r in stderr and (fatal := fatal_error(stderr[r])):
            p = position(r, (last_beats or {}).get(r), None, ddp)
            coll: CollectiveState = _beat_collective(r, last_beats, ddp) or {"op": fatal["op"]}
            failed[r] = {"exception": fatal["exception"], "traceback": fatal["traceback"], "died": True,
                         "failed_collective": {**coll, "call_site": fatal["call_site"] or p.call_site}}
    if not failed:
        # A rank a signal ended (at start-up, before any peer could fail) while torchrun stopped every silent one.
        signalled = _signalled(statuses, failed)
        silent_roots = [r for r, s in statuses.items() if s is None and r not in torn_down]
        table = first_signalled or {}
        if signalled is None and silent_roots and all(r in table for r in silent_roots):
            # A signal its probe could not see (SIGKILL, SIGHUP, SIGUSR1 ... at start-up) left no status: torchrun's
            # failure table names that rank as the first observed failure and its signal; the others it stopped.
            victims = sorted(r for r, s in statuses.items() if s is None and r not in silent_roots)
            return [rank_crashed_finding(
                r, f"Rank {r} failed first (the process died): killed by {table[r]}",
                "A signal from outside the job (a user's kill, a scheduler's preemption or time limit, the OOM "
                "killer) ended this rank; torchrun then stopped the others.",
                exception=f"killed by {table[r]}", traceback="", call_site=None, victims=victims)
                for r in sorted(silent_roots)]
        if signalled is None or silent_roots:
            return []
        failed = {signalled: _signal_root(statuses[signalled] or {})}
        victims = sorted(r for r, s in statuses.items() if s is None)
        s = failed[signalled]
        return [rank_crashed_finding(
            signalled, f"Rank {signalled} failed first (the process died): {s['exception']}",
            "A signal from outside the job (a user's kill, a scheduler's preemption or time limit) ended this "
            "rank; torchrun then stopped the others.",
            exception=s["exception"], traceback="",
            call_site=(s.get("failed_collective") or {}).get("call_site"), victims=victims)]
    roots = {r: s for r, s in failed.items() if not is_victim(s.get("exception") or "")}
    victims = sorted(r for r in failed if r not in roots)
    if not roots and (left := left_early(statuses, failed)):
        # Every failure is a peer's connection error, and a rank had already returned: it is the culprit.
        return [left_early_finding(r, statuses[r] or {}, failed) for r in left]
    silent = sorted(r for r, s in statuses.items() if s is None and r not in failed and r not in torn_down)
    if not roots and silent:
        # A rank killed outright (SIGKILL, the OOM killer) writes nothing; its peers' connection errors follow from it.
        roots = {r: FailedRank(exception=silent_death(oom_kills), died=True) for r in silent}
    elif not roots and (signalled := _signalled(statuses, failed)) is not None:
        # A rank killed by a signal it did not catch (SIGTERM, SIGINT by hand or a scheduler) writes its status and
        # no exception; its peers' connection errors follow from it (it used to be the peer that was blamed).
        roots = {signalled: {**(failed.get(signalled) or {}), **_signal_root(statuses[signalled] or {})}}
    elif not roots:  # everyone is a victim: the first to fail is the best guess
        first = min(failed, key=lambda r: failed[r].get("ended_at") or 0)
        roots = {first: failed[first]}
        victims = [r for r in victims if r != first]
    # A rank torchrun stopped after the root failed (a signal, no exception of its own) is a victim too: whether it
    # saw its peer's connection close first (an exception) or was stopped first is a race.
    victims = sorted(set(victims) | {r for r, st in statuses.items() if st and r not in failed and r not in roots
                                     and (r in torn_down or st.get("signal"))})
    out: list[Finding] = []
    for r, s in sorted(roots.items()):
        exc = s.get("exception") or ""
        fc: CollectiveState = s.get("failed_collective") or {}
        if any(p in exc for p in MISMATCH_PATTERNS):
            # A status cut short (the rank killed before its last write) leaves the last heartbeat to say where it was.
            colls: dict[int, CollectiveState] = {
                rr: (ss.get("failed_collective") or ss.get("last_collective") or _beat_collective(rr, last_beats, ddp))
                for rr, ss in failed.items()}
            ps = [c for c in colls.values() if c.get("op")]
            differs = [f for f in ("op", "group", "sizes") if len({repr(c.get(f)) for c in ps}) > 1]
            m = _GLOO_SIZES.search(exc)
            detail: GlooSizes | None = ({"rank": r, "received_bytes": int(m.group(1)), "expected_bytes": int(m.group(2))}
                                        if m else None)
            if detail and "bytes" not in differs:
                differs.append("bytes")
            blamed = None
            every, lasts = _where_each(statuses, colls, last_beats, ddp)
            if detail is not None:
                # gloo aborts the rank that *received* the odd bytes: the rank that sent them is the one to blame.
                blamed = gloo_mismatch_culprits(every, lasts, r, ddp)
            if blamed is not None and blamed[0] != [r]:
                culprits, why = blamed
                aborted: AbortedRank = {"rank": r, "exception": exc.splitlines()[0][:300]}
                out.append(mismatch_finding(every, [f for f in ("op", "group", "sizes", "bytes")
                                                    if f in differs or f in _differs(every)],
                                            debug, detail, culprits=culprits, why=why, aborted=aborted))
                continue
            out.append(mismatch_finding(colls, differs, debug, detail))
        unused = _unused_parameters(exc, sorted(r2 for r2, s2 in roots.items() if any(
            p.search(s2.get("exception") or "") for p in (_UNUSED_INDICES, _UNUSED_NAMES, _UNUSED_LIGHTNING))),
            (param_names or {}).get(r), ddp_cfg)
        if unused is not None:
            out.append(unused)
        died = " (the process died)" if s.get("died") else ""
        first_note = " first" if len(roots) == 1 and victims else ""
        out.append(rank_crashed_finding(
            r, f"Rank {r} failed{first_note}{died}: {exc.splitlines()[0][:300]}",
            "This rank's exception is the root cause; the other ranks' errors (connection closed, "
            "timeouts) follow from it." if victims else "Fix the exception in this rank's traceback.",
            exception=exc, traceback=s.get("traceback", ""), call_site=fc.get("call_site"), victims=victims,
        ))
    return _dedupe(out)


def silent_death(oom_kills: int | None) -> str:
    """What killed a rank that left no status nor message, as far as the kernel's OOM-kill count says."""
    if oom_kills is None:
        return "killed by a signal, leaving no status or message (SIGKILL or the OOM killer?)"
    if oom_kills > 0:
        return (f"killed by SIGKILL, leaving no status or message, and the kernel's OOM killer fired {oom_kills} "
                "time(s) meanwhile (/proc/vmstat oom_kill): most likely out of host memory")
    return ("killed by a signal, leaving no status or message (SIGKILL; not the kernel's memory killer: its count "
            "in /proc/vmstat did not change during the job)")


def _differs(colls: Mapping[int, CollectiveState]) -> list[str]:
    ps = [c for c in colls.values() if c.get("op")]
    return [f for f in ("op", "group", "sizes") if len({repr(c.get(f)) for c in ps}) > 1]


def _where_each(statuses: Mapping[int, RankStatusDoc | None], colls: Mapping[int, CollectiveState],
                last_beats: Mapping[int, Beat | None] | None,
                ddp: bool = True) -> tuple[dict[int, CollectiveState], dict[int, CollectiveState]]:
    """Every rank's collective (a failed rank's, else the one its status says it was in when torchrun stopped it,
    else its last heartbeat's) and the last one it completed (status, else heartbeat): the waiting ranks too."""
    where: dict[int, CollectiveState] = {}
    last: dict[int, CollectiveState] = {}
    for r, st in statuses.items():
        b = (last_beats or {}).get(r) or {}
        c = colls.get(r) or (st or {}).get("failed_collective") or _beat_collective(r, last_beats, ddp)
        if c:
            where[r] = c
        lc = (st or {}).get("last_collective") or b.get("last_collective")
        if lc:
            last[r] = lc
    return where, last


# The probe's status names a rank in backward() so (probes/heartbeat.py); a heartbeat's position names it DDP_BUCKETS.
_STATUS_DDP = "backward (DDP gradient all-reduce)"


def _in_ddp(c: CollectiveState) -> bool:
    return c.get("op") in (DDP_BUCKETS, _STATUS_DDP)


def _coll_key(c: CollectiveState) -> str:
    return repr((DDP_BUCKETS, None) if _in_ddp(c) else (c.get("op"), c.get("sizes")))


def gloo_mismatch_culprits(colls: Mapping[int, CollectiveState], lasts: Mapping[int, CollectiveState],
                           receiver: int, ddp: bool = True) -> tuple[list[int], str] | None:
    """Who sent gloo's "Received data size doesn't match" bytes (the rank gloo aborts is the one that received them):
    (culprits, why), or None when the evidence does not tell. In order:

    - "skipped": the ranks in the next step's DDP bucket all-reduce last completed (``lasts``) the very collective
      the aborted rank and others wait in (same op and line, an earlier number): they skipped it this time;
    - "left-or-extra": the ranks not in DDP's bucket all-reduce while others are (fewer batches, or an extra
      collective);
    - "odd-one-out": the ranks whose collective (op, group, sizes) differs from what most ranks run;
    - "sender": on a tie (two ranks), the rank(s) whose collective differs from the receiver's.
    ``ddp`` False (the job built no DDP module): the first two rules do not apply. Linear in ranks."""
    ps = {r: c for r, c in colls.items() if c.get("op")}
    if len(ps) < 2 or receiver not in ps:
        return None
    in_ddp = {r for r, c in ps.items() if _in_ddp(c)} if ddp else set()  # no DDP: no rank is in its all-reduce
    if in_ddp and len(in_ddp) < len(ps):
        waited = {(c.get("op"), c.get("call_site"), c.get("seq")) for r, c in ps.items() if r not in in_ddp}
        if (receiver not in in_ddp and all(op != "barrier" for op, _, _ in waited)
                and all(_ran_before(lasts.get(r), waited) for r in in_ddp)):
            # The ranks in DDP's all-reduce last completed the very collective the others wait in (same op, same
            # line, an earlier number): this time they went past it to the next step's bucket all-reduce.
            return sorted(in_ddp), "skipped"
        # As for a hang (findings/hang.diagnose_hang): the ranks in DDP's per-step all-reduce are where training
        # should be; the others left the loop early or called an extra collective.
        return sorted(set(ps) - in_ddp), "left-or-extra"
    keys = {r: _coll_key(c) for r, c in ps.items()}
    counts = Counter(keys.values()).most_common()
    if len(counts) > 1 and counts[0][1] > counts[1][1]:
        return sorted(r for r, k in keys.items() if k != counts[0][0]), "odd-one-out"
    sent = sorted(r for r, c in ps.items() if _differ(c, ps[receiver]))
    return (sent, "sender") if sent else None


def _ran_before(last: CollectiveState | None, waited: set[tuple[str | None, str | None, int | None]]) -> bool:
    if not last or last.get("op") is None:
        return False
    seq = last.get("seq")
    return any(last.get("op") == op and last.get("call_site") == site and isinstance(seq, int) and isinstance(n, int)
               and seq < n for op, site, n in waited)


def _differ(a: CollectiveState, b: CollectiveState) -> bool:
    """Two ranks' collectives differ in what both of them record (a rank that died may have left only its op)."""
    return any(a.get(f) and b.get(f) and repr(a.get(f)) != repr(b.get(f)) for f in ("op", "group", "sizes"))


_TORCHRUN_STOPS = re.compile(r"Sending process (\d+) closing signal SIG")


def torchrun_stopped_pids(text: str) -> set[int]:
    """PIDs torchrun's agent stopped itself (after another worker ended): "Sending process 1411 closing signal
    SIGTERM" in its log."""
    return {int(m.group(1)) for m in _TORCHRUN_STOPS.finditer(text)}


def _signalled(statuses: Mapping[int, RankStatusDoc | None], failed: Mapping[int, FailedRank]) -> int | None:
    """The first rank (by when it ended) that a signal ended without an exception of its own, if any. Ranks that
    torchrun stopped after it (SIGTERM too) ended later."""
    hit = [(_num(s.get("ended_at"), float("inf")), r)
           for r, s in statuses.items() if s and s.get("signal") and not s.get("exception")]
    return min(hit)[1] if hit else None


def _signal_root(status: RankStatusDoc) -> FailedRank:
    site = status.get("exit_site")
    where = f" at {site}" if isinstance(site, str) and site else ""
    step = status.get("steps_completed")
    after = f" after {step} iteration(s)" if isinstance(step, int) else ""
    return {"exception": f"killed by {status.get('signal')} (exit code {status.get('exit_code')}){where}{after}",
            "died": True, "failed_collective": status.get("last_collective") or {}}


def left_early(statuses: Mapping[int, RankStatusDoc | None], failed: Mapping[int, FailedRank]) -> list[int]:
    """Ranks that returned (any exit code, no exception, not killed by a signal) before the first victim failed:
    the others were still waiting for them in a collective (issues 12.4, 16.5)."""
    first_failure = min((_num(s.get("ended_at")) for s in failed.values()), default=0.0)
    out = []
    for r, s in statuses.items():
        if not s or r in failed or s.get("exception") or s.get("signal"):
            continue
        code = s.get("exit_code")
        if isinstance(code, int) and code > 128:  # killed (SIGTERM from torchrun or ddpdoctor), not left
            continue
        ended = _num(s.get("ended_at"))
        if ended and (not first_failure or ended <= first_failure):
            out.append(r)
    return sorted(out)


def left_early_finding(rank: int, status: RankStatusDoc, failed: Mapping[int, FailedRank]) -> Finding:
    got = status.get("last_collective")
    last: CollectiveState | None = got if isinstance(got, dict) else {}
    site = status.get("exit_site")
    where = f"at {site}" if site else f"after its last collective at {(last or {}).get('call_site')}"
    step = status.get("steps_completed")
    waiting: dict[int, CollectiveState] = {r: (s.get("failed_collective") or {}) for r, s in sorted(failed.items())}
    ops = sorted({str(c.get("op")) for c in waiting.values() if c.get("op")})
    code = status.get("exit_code")
    how = "exited with code 0" if code in (0, None) else f"exited with code {code}"
    return Finding(
        "rank-left-early", Severity.ERROR,
        f"Rank {rank} {how} at step {step} ({where}) while rank(s) {sorted(failed)} still waited for it in "
        f"{', '.join(ops) or 'a collective'}; their errors (connection closed by peer) follow from it",
        ranks=[rank],
        evidence={"rank": rank, "exit_code": code, "step": step, "call_site": site or (last or {}).get("call_site"),
                  "last_collective": last or None, "victims": sorted(failed),
                  "waiting_in": {str(r): {k: c.get(k) for k in ("op", "group", "seq", "call_site")}
                                 for r, c in waiting.items()}},
        advice="Every rank must run the same collectives: this rank ended its loop (or the script) early. Give every "
               "rank the same number of iterations (DistributedSampler(drop_last=True), the same stopping "
               "condition on every rank, e.g. decided on rank 0 and broadcast), or use DDP's join() for uneven inputs.",
    )


def _num(value: object, default: float = 0.0) -> float:
    """A number from a status file (which a killed rank may have left short), or ``default``."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _unused_parameters(exc: str, ranks: list[int], names: list[str] | None,
                       ddp_cfg: DDPModule | None = None) -> Finding | None:
    params: list[str] = []
    m = _UNUSED_NAMES.search(exc)
    unnamed = ""
    if m:
        params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    elif m := _UNUSED_INDICES.search(exc):
        idx = [int(i) for i in m.group(2).split()]
        params = [names[i] if names and i < len(names) else f"index {i}" for i in idx]
    elif _UNUSED_LIGHTNING.search(exc):
        unnamed = (" Lightning replaces DDP's message and the names in it (even under TORCH_DISTRIBUTED_DEBUG=INFO): "
                   "`ddpdoctor check-sync` names the parameters that never get a gradient.")
    else:
        return None
    return Finding(
        "unused-parameters", Severity.ERROR,
        f"Parameters that got no gradient: {', '.join(params)}" if params else
        "Parameters that got no gradient (their names are not in the error)",
        ranks=ranks, evidence={"ranks": ranks, "parameters": params},
        advice="Use these parameters in forward(), freeze them (requires_grad=False), or "
               + (f"set {ddp_option(ddp_cfg, 'find_unused_parameters', True)}" if framework_of(ddp_cfg)
                  else "pass find_unused_parameters=True to DistributedDataParallel")
               + " (it costs a graph traversal each step)." + unnamed,
    )


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[str] = set()
    out = []
    for f in findings:
        key = f.id if f.id in ("collective-mismatch", "unused-parameters") else f"{f.id}:{f.ranks}"
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out

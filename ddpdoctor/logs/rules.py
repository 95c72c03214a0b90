"""Events from logs -> findings: hang, rank-crashed, collective-mismatch, unused-parameters, misleading-root-cause,
job-failed (docs/findings.md). Pure: no files, no printing."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from ddpdoctor.findings.failure import hang_finding
from ddpdoctor.findings.framework_advice import ddp_option, framework_of_files
from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.logs import hangs
from ddpdoctor.logs.events import (
    ChildFailure,
    CollectiveStack,
    Event,
    Fingerprint,
    FingerprintMismatch,
    GlooSizeMismatch,
    GlooTimeout,
    MonitoredBarrierFailure,
    RankException,
    RankHangState,
    UnusedParameters,
    WatchdogTimeout,
    WatchdogWorkState,
)
from ddpdoctor.logs.flight_recorder import FrGroupState

# Errors a rank gets because *another* rank failed or stalled: never the root cause.
VICTIM = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|Timed out waiting \d+ms for (?:recv|send)"
    r"|failed to pass monitoredBarrier|Watchdog caught collective operation timeout|communicator was aborted"
    r"|Some NCCL operations have failed or timed out|remote process exited|DistNetworkError|Socket Timeout"
    r"|got signal: \d+|SignalException|KeyboardInterrupt|ProcessGroupNCCL.*(?:abort|timed? ?out)"
    r"|failed to recv, got 0 bytes|recvValue failed|Stopped waiting for|retr(?:ie|ei)ving ncclUniqueId"
    r"|wait timeout after \d+ms|sendBytes failed|RendezvousConnectionError|RendezvousClosedError",
    re.IGNORECASE)
# Errors another finding explains better than "rank N crashed".
EXPLAINED = re.compile(
    r"Detected mismatch between collectives|Received data size doesn't match"
    r"|Expected to have finished reduction in the prior iteration|did not receive grad"
    r"|LightningModule has parameters that were not used"
    # the failure grammar's own findings (logs/triage.py): oom, model-mismatch, nccl-error, watchdog-stuck
    r"|out of memory|OutOfMemoryError|DDP expects same model|appears not to match (?:sizes|strides)"
    r"|NCCL error in:(?!.*remote process exited)|ncclUnhandledCudaError|ncclSystemError|ncclInternalError"
    r"|ncclInvalidUsage|watchdog got stuck|Heartbeat monitor timed out|CUDA error: |illegal memory access"
    r"|device-side assert"
    # a rendezvous that was never reached (store-failure explains it: address, port, firewall, start order)
    r"|connect\(\) timed out|while trying to connect|failed to connect to any network address"
    # init_process_group's barrier (a hang at start-up), DDP's reducer hooks, FSDP/DTensor layouts (logs/triage.py)
    r"|store based barrier|Expected to mark a variable ready only once|marked as ready twice"
    r"|uniform `?requires_grad|Must flatten tensors with uniform|world_?size times input tensor size"
    r"|output size times world ?size|Non-sharded dimensions should have identical size|requires even sharding"
    r"|not divisible by FSDP world size|`placements` must have the same length|placement per mesh dim"
    r"|Cannot distribute a DTensor|mixed torch\.Tensor and DTensor|materialized from meta device")
LAUNCHER_TYPES = ("ChildFailedError", "CalledProcessError", "ProcessRaisedException")
STACK_LIMIT = 8000


@dataclass
class Evidence:
    """Everything the parsers found in all inputs."""

    events: list[Event] = field(default_factory=list)
    known_ranks: set[int] = field(default_factory=set)
    flight_recorder: dict[int, dict[str, FrGroupState]] = field(default_factory=dict)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def classify(exc: RankException) -> str:
    """'victim', 'explained' or 'crash' (a real failure of this rank)."""
    text = f"{exc.exc_type}: {exc.message}"
    if EXPLAINED.search(text):
        return "explained"
    if VICTIM.search(text) or exc.exc_type.endswith(LAUNCHER_TYPES):
        return "victim"
    return "crash"


def _rank_exceptions(ev: Evidence) -> dict[int, list[RankException]]:
    out: dict[int, list[RankException]] = {}
    for exc in ev.of(RankException):
        if exc.rank is not None:
            out.setdefault(exc.rank, []).append(exc)
    return out


def _user_site(excs: list[RankException], needle: str = "") -> str | None:
    for exc in excs:
        if needle in exc.message and exc.user_frame():
            return str(exc.user_frame())
    return None


def _diff(collectives: dict[int, Fingerprint]) -> list[str]:
    out = []
    for name in ("seq", "op", "shapes", "dtypes", "device"):
        values = {r: getattr(fp, name) for r, fp in collectives.items()}
        if len({repr(v) for v in values.values()}) > 1:
            out.append(f"{name}: " + " vs ".join(f"rank {r} {v}" for r, v in sorted(values.items())))
    return out


def mismatch_findings(ev: Evidence, excs: dict[int, list[RankException]],
                      failures: list[ChildFailure]) -> list[Finding]:
    findings: list[Finding] = []
    mismatches: list[FingerprintMismatch] = ev.of(FingerprintMismatch)
    if mismatches:
        own = {m.self_rank: m.self_fp for m in mismatches}
        # A rank's own fingerprint is authoritative; the peer's side is second-hand (the wrapper's internal
        # collectives can garble it), so it only fills in ranks that reported nothing themselves.
        collectives = dict(own)
        for m in mismatches:
            if m.peer_rank is not None and m.peer_fp is not None and m.peer_rank not in collectives:
                collectives[m.peer_rank] = m.peer_fp
        ranks = sorted(collectives)
        sites = {r: s for r in ranks if (s := _user_site(excs.get(r, []), "Detected mismatch"))}
        differs = _diff(collectives) or [m.differs for m in mismatches[:1] if m.differs]
        seqs = {r: fp.seq for r, fp in collectives.items() if fp.seq is not None}
        behind = sorted(r for r, s in seqs.items() if s == min(seqs.values())) if len(set(seqs.values())) > 1 else []
        ops = " vs ".join(f"rank {r}: {fp.op or '?'}{fp.shapes[0] if fp.shapes else ''}"
                          for r, fp in sorted(collectives.items()))
        findings.append(Finding(
            "collective-mismatch", Severity.ERROR, f"Ranks called different collectives ({ops})", ranks=ranks,
            evidence={"ranks": ranks, "collectives": {str(r): fp.to_json() for r, fp in sorted(collectives.items())},
                      "call_sites": {str(r): s for r, s in sorted(sites.items())}, "differs": differs,
                      "reported": mismatches[0].differs, "behind_ranks": behind,
                      "source": "TORCH_DISTRIBUTED_DEBUG=DETAIL", "where": str(mismatches[0].where)},
            advice=("Every rank must call the same collectives in the same order with the same shapes and dtypes. "
                    + (f"Rank(s) {behind} are at an earlier sequence number: they skipped a collective the others "
                       "ran (a rank-dependent branch, or uneven batches per rank). " if behind else "")
                    + "Look at the call sites above for a condition on rank or on data size."),
        ))
    sizes: list[GlooSizeMismatch] = ev.of(GlooSizeMismatch)
    if sizes and not mismatches:
        detected = sorted({s.rank for s in sizes if s.rank is not None})
        if not detected:
            aborted = [f.rank for f in failures if f.signal == "SIGABRT" and f.rank is not None]
            detected = sorted(set(aborted)) if len(set(aborted)) == 1 else []
        peers = sorted(r for r, es in excs.items() if any(classify(e) == "victim" for e in es))
        ranks = sorted(set(detected) | set(peers))
        sites = {r: str(f) for r in ranks for e in excs.get(r, [])[:1] if (f := e.user_frame())}
        first = sizes[0]
        got = f"received {first.received_bytes} bytes where its collective expected {first.expected_bytes}" \
            if first.received_bytes is not None else "received a message of the wrong size"
        findings.append(Finding(
            "collective-mismatch", Severity.ERROR,
            f"gloo: rank {detected[0] if detected else '?'} {got}: the ranks ran different collectives", ranks=ranks,
            evidence={"ranks": ranks, "detected_on": detected, "collectives": {
                str(r): {"op": e.torch_distributed_call()} for r in ranks for e in excs.get(r, [])[:1]
                if e.torch_distributed_call()},
                "call_sites": {str(r): v for r, v in sorted(sites.items())},
                "differs": [f"message size: {got}"], "source": "gloo", "where": str(first.where)},
            advice="A collective's tensors differ in size (or the ranks are in different collectives). Re-run with "
                   "TORCH_DISTRIBUTED_DEBUG=DETAIL to get each rank's op, shape and dtype.",
        ))
    return findings


def unused_findings(ev: Evidence, excs: dict[int, list[RankException]] | None = None) -> list[Finding]:
    events: list[UnusedParameters] = ev.of(UnusedParameters)
    if not events:
        return []
    # A traceback through Lightning, the HF Trainer or accelerate: that framework built DDP, so say its setting.
    framework = framework_of_files(f.file for es in (excs or {}).values() for e in es for f in e.frames)
    lightning_said = any("LightningModule has parameters" in e.message for es in (excs or {}).values() for e in es)
    names: dict[int | None, list[str]] = {}
    indices: dict[int | None, list[int]] = {}
    for e in events:
        names.setdefault(e.rank, [])
        indices.setdefault(e.rank, [])
        names[e.rank] += [n for n in e.names if n not in names[e.rank]]
        indices[e.rank] += [i for i in e.indices if i not in indices[e.rank]]
    all_names = sorted({n for ns in names.values() for n in ns})
    all_idx = sorted({i for ix in indices.values() for i in ix})
    ranks = sorted(r for r in names if r is not None)
    what = ", ".join(all_names[:6]) + (" …" if len(all_names) > 6 else "") if all_names else (
        f"parameter indices {all_idx[:10]}" if all_idx else "names not printed")
    return [Finding(
        "unused-parameters", Severity.ERROR, f"Parameters that never got a gradient: {what}", ranks=ranks,
        evidence={"names": all_names, "indices": all_idx,
                  "per_rank": {str(r): {"names": names[r], "indices": indices[r]} for r in ranks}},
        advice=("Use these parameters in forward (or delete them), or "
                + (f"set {ddp_option({'built_by': framework}, 'find_unused_parameters', True)}" if framework else
                   "pass find_unused_parameters=True to DistributedDataParallel")
                + " (it costs an extra traversal per step)."
                + ("" if all_names else " Lightning replaces DDP's message and the names in it (even under "
                   "TORCH_DISTRIBUTED_DEBUG=INFO): `ddpdoctor check-sync` names the parameters that never get a gradient."
                   if lightning_said else " Set TORCH_DISTRIBUTED_DEBUG=INFO to get their names.")),
    )]


def _hang_finding(h: hangs.HangAnalysis, stalled_all: set[int], excs: dict[int, list[RankException]],
                  nccl_stacks: dict[int, CollectiveStack], sources: list[str], crashed: dict[int, str]) -> Finding:
    stalled = sorted(stalled_all - h.culprits)
    culprits = sorted(h.culprits)
    involved = sorted(set(stalled) | set(culprits))
    stacks = {str(r): excs[r][0].traceback[:STACK_LIMIT] for r in involved if excs.get(r)}
    call_sites = dict(h.call_sites)
    for r in involved:
        if r in nccl_stacks:  # the stack of the very collective that timed out beats any later traceback
            stacks.setdefault(str(r), nccl_stacks[r].text[:STACK_LIMIT])
            if r not in call_sites and nccl_stacks[r].user_frame():
                call_sites[r] = str(nccl_stacks[r].user_frame())
        if r not in call_sites and excs.get(r) and excs[r][0].user_frame():
            call_sites[r] = str(excs[r][0].user_frame())
    op = h.op or "an unknown collective"
    if h.mismatch:
        op = "different collectives (" + ", ".join(f"rank {r}: {v.get('op')}" for r, v in sorted(h.mismatch.items())) + ")"
    title = (f"Hang: rank(s) {stalled} stuck in {op}" + (f" #{h.seq}" if h.seq is not None else "")
             + (f"; culprit rank(s) {culprits}" if culprits else "; culprit not in these logs")
             + (" (crashed: see rank-crashed)" if culprits and set(culprits) <= set(crashed) else ""))
    advice = ("Look at what the culprit rank(s) did instead of entering the collective: a rank-dependent branch, "
              "uneven data per rank (use DistributedSampler(drop_last=True) or DDP's join()), or a stall outside "
              "torch.distributed. Run under `ddpdoctor run` to get every rank's stack at the moment of the hang.")
    if h.diverged and not h.mismatch:
        d = h.diverged
        title = (f"Hang in collective #{d['seq']}: rank(s) {d['waiting']} wait in {d['op'] or 'it'} with nothing "
                 f"enqueued after it, rank(s) {d['ahead']} went on to #{d['ahead_to']}; culprit not decidable from "
                 "these logs")
        advice = (f"Every rank that reported is inside collective #{d['seq']} and it never completed. Either the "
                  f"ranks ran different collectives at #{d['seq']} (a branch on the node, rank or data, or different "
                  "code or config on one node: a collective mismatch), or the same one could not complete between "
                  "them (the network: look for NCCL WARN lines of the same minutes). The ahead ranks' op at "
                  f"#{d['seq']} decides: their node's watchdog lines (\"WorkNCCL(SeqNum={d['seq']}, OpType=...\"), "
                  "or Flight Recorder dumps (TORCH_NCCL_TRACE_BUFFER_SIZE=2000; `ddpdoctor logs` reads them); give "
                  "every node's log to `ddpdoctor logs`.")
    return hang_finding(
        title, sorted(set(stalled) | set(culprits)),
        stalled_ranks=stalled, culprit_ranks=culprits,
        collective={"op": h.op, "seq": h.seq, "group": h.group}, why=h.why,
        call_sites={str(r): s for r, s in sorted(call_sites.items())},
        detected_after_s=h.detected_after_s, source=h.source, sources=sources,
        per_rank={str(r): v for r, v in sorted(h.per_rank.items())}, stacks=stacks,
        **({"diverged": h.diverged} if h.diverged and not h.mismatch else {}), advice=advice,
    )


def _mismatch_differs(by_rank: dict[int, RankHangState]) -> list[str]:
    out = []
    keys: tuple[Literal["op", "shapes", "numel_in"], ...] = ("op", "shapes", "numel_in")
    for key in keys:
        values = {r: v.get(key) for r, v in by_rank.items() if key in v}
        if len({repr(v) for v in values.values()}) > 1:
            out.append(f"{key}: " + " vs ".join(f"rank {r} {v}" for r, v in sorted(values.items())))
    return out


def _watchdogs_disagree(timeouts: list[WatchdogTimeout]) -> list[Finding]:
    """Watchdogs that time out at the same sequence number of one group in different ops (REDUCE in one node's log,
    ALLREDUCE in another's): the ranks ran different collectives; the hang is the consequence. Compared per input
    as well as per rank, since each node's log may number its ranks from 0."""
    by_seq: dict[tuple[str | None, int], dict[tuple[str, int | None], set[tuple[str, int | None]]]] = {}
    for t in timeouts:
        if t.seq is not None:
            by_seq.setdefault((t.group, t.seq), {}).setdefault((t.op, t.numel_in), set()).add((t.where.source, t.rank))
    for (group, seq), ops in sorted(by_seq.items(), key=lambda kv: kv[0][1]):
        if len(ops) < 2:
            continue
        sides = {f"{op}" + (f" ({numel} elements)" if numel is not None else ""): sorted(who, key=str)
                 for (op, numel), who in ops.items()}
        text = "; ".join(f"{op} on " + ", ".join(f"{src} rank {r}" for src, r in who[:4])
                         + (f" and {len(who) - 4} more" if len(who) > 4 else "") for op, who in sorted(sides.items()))
        ranks = sorted({r for who in sides.values() for _, r in who if r is not None})
        return [Finding(
            "collective-mismatch", Severity.ERROR,
            f"Watchdogs disagree on collective #{seq}: {text}: the ranks ran different collectives (the hang follows "
            "from it)", ranks=ranks,
            evidence={"ranks": ranks, "sequence_number": seq, "group": group,
                      "collectives": {op: [f"{src}: rank {r}" for src, r in who] for op, who in sorted(sides.items())},
                      "differs": [f"op at #{seq}: " + " vs ".join(sorted(sides))], "source": "nccl-watchdog"},
            advice="Every rank must call the same collectives in the same order: the code took a different path on "
                   "one node (a branch on the node, hostname, local rank or data, or a different version of the code "
                   "or config on that node).",
        )]
    return []


def hang_findings(ev: Evidence, excs: dict[int, list[RankException]], crashed: dict[int, str],
                  notes: list[str]) -> list[Finding]:
    fr, fr_notes = hangs.from_flight_recorder(ev.flight_recorder)
    notes.extend(fr_notes)
    analyses = [a for a in (
        fr,
        hangs.from_nccl_watchdog(ev.of(WatchdogTimeout), ev.of(WatchdogWorkState), ev.known_ranks),
        hangs.from_monitored_barrier(ev.of(MonitoredBarrierFailure), excs),
        hangs.from_gloo_timeouts(ev.of(GlooTimeout), excs, ev.known_ranks, crashed),
    ) if a is not None]
    if not analyses:
        return []
    best = analyses[0]
    stalled = set().union(*(a.stalled for a in analyses))
    nccl_stacks = {s.rank: s for s in ev.of(CollectiveStack) if s.rank is not None}
    findings = [_hang_finding(best, stalled, excs, nccl_stacks, [a.source for a in analyses], crashed)]
    if not best.mismatch:
        findings += _watchdogs_disagree(ev.of(WatchdogTimeout))
    if best.mismatch:
        ranks = sorted(best.mismatch)
        findings.append(Finding(
            "collective-mismatch", Severity.ERROR,
            "Ranks wait in different collectives: " + ", ".join(
                f"rank {r} in {v.get('op')}" for r, v in sorted(best.mismatch.items())), ranks=ranks,
            evidence={"ranks": ranks, "collectives": {str(r): v for r, v in sorted(best.mismatch.items())},
                      "call_sites": {str(r): v["call_site"] for r, v in sorted(best.mismatch.items())
                                     if v.get("call_site")},
                      "differs": _mismatch_differs(best.mismatch), "source": best.source},
            advice="Every rank must call the same collectives in the same order: look for a branch on rank or data.",
        ))
    return findings

"""The report of a watched run (run, profile, check-sync): the job's own findings, then the hang, crash and --debug
findings, and the typed hang section. Reads RUN/hang.json, RUN/heartbeats.json and the ranks' status and stderr
files through rundir/; the rules live in findings/hang.py, findings/crash.py and findings/job.py."""

from __future__ import annotations

import dataclasses

from ddpdoctor.findings.job import ended_findings
from ddpdoctor.findings.model import Finding
from ddpdoctor.report import Report
from ddpdoctor.reports.job import job_report
from ddpdoctor.reports.sections import HangClassJson, HangSection, HangVerdict
from ddpdoctor.rundir import artefacts
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.loaders import hang_doc, heartbeats_doc, rank_statuses, rank_text
from ddpdoctor.rundir.records import RankStatusDoc
from ddpdoctor.rundir.schema import DDPModule, Hang, Heartbeats, Manifest, Position, RankInfo


def watched_report(run: RunDir, command: str, *, locked: bool, debug: bool = False,
                   analyse_traces: bool = False) -> Report:
    """job_report plus the hang/crash findings of a watched run (also used by `profile`). ``locked``: a live
    ddpdoctor still holds the run directory (launch/runlock.is_locked), so a manifest still "running" is not a
    ddpdoctor that died."""
    base = job_report(run, command, analyse_traces=analyse_traces)
    ended, stopped = ended_findings(manifest_mod.load_typed(run), locked)
    findings = [*base.findings, *ended, *watch_findings(run, debug=debug, stopped=stopped is not None)]
    parts = list(base.parts)
    hang = artefacts.load_optional(run.root / "hang.json", Hang)
    if hang is not None:
        parts.append(HangSection(hang_verdict(hang, str(run.root / "hang.txt"))))
        # Ranks killed because of the hang write no status: that is not a separate problem.
        findings = [f for f in findings if f.id != "rank-no-status"]
    if stopped is not None:  # nor ranks killed because ddpdoctor was stopped
        findings = [f for f in findings if f.id != "rank-no-status"]
    crashed = {r for f in findings if f.id == "rank-crashed" for r in f.ranks}
    # ... and so is the rank gloo aborted on a collective mismatch another rank caused (findings/crash.py).
    crashed |= {f.evidence["aborted"]["rank"] for f in findings
                if f.id == "collective-mismatch" and isinstance(f.evidence.get("aborted"), dict)}
    # A rank that died is named by rank-crashed (with what its stderr said): its "no status" is the same event; so is
    # a rank torchrun stopped after the crash (its peers' teardown, not a problem of its own).
    followers = crashed | (torn_down_ranks(run, rank_statuses(run)) if crashed else set())
    findings = [f for f in findings if f.id != "rank-no-status" or not set(f.ranks) <= followers]
    findings.extend(_aborted_after_finish(run, manifest_mod.load_typed(run)))
    notes = [*base.notes, *monitor_notes(artefacts.load_optional(run.root / "heartbeats.json", Heartbeats))]
    return Report(command, parts=parts, findings=findings, notes=notes, stopped=stopped)


def _aborted_after_finish(run: RunDir, manifest: Manifest) -> list[Finding]:
    """`aborted-after-finish` (findings/job.py): a failed job whose every rank wrote exit status 0. Only then are
    torchrun's failure tables (RUN/torchrun/**/torchrun.log) and the ranks' last stderr lines read."""
    from ddpdoctor.findings.job import TERMINATE_MARK, aborted_after_finish

    statuses = rank_statuses(run)
    if not manifest.exit_code or not statuses or any(s is None or s.get("exit_code") != 0
                                                            for s in statuses.values()):
        return []
    signals, roots = torchrun_signals(run)
    last_words: dict[int, str] = {}
    for r in statuses:
        tail = (rank_text(run, r, "stderr.log") or "")[-65536:]
        said = [ln.strip() for ln in tail.splitlines() if ln.lstrip().startswith(TERMINATE_MARK)]
        if said:
            last_words[r] = said[-1][:200]
    found = aborted_after_finish(manifest, statuses, signals, roots, last_words)
    return [found] if found is not None else []


def torchrun_signals(run: RunDir) -> tuple[dict[int, str], set[int]]:
    """rank -> the signal that ended it, and the first failure(s), from torchrun's failure tables (each node's
    RUN/torchrun/**/torchrun.log; the table is at its end, so only the last 256 KiB are read)."""
    from ddpdoctor import safe_io
    from ddpdoctor.errors import BadInput
    from ddpdoctor.logs.launchers import torchrun_failures
    from ddpdoctor.logs.lines import split_lines

    signals: dict[int, str] = {}
    roots: set[int] = set()
    for log in sorted(run.torchrun_logs.glob("**/torchrun.log"))[:64]:
        try:
            data = safe_io.read_bytes(log, 64 << 20, decompress=False)[-(256 << 10):]
        except (OSError, BadInput):
            continue
        failures, _ = torchrun_failures(split_lines(str(log), data.decode(errors="replace")))
        for f in failures:
            if f.rank is not None and f.signal:
                signals[f.rank] = f.signal
                if f.is_root_cause:
                    roots.add(f.rank)
    return signals, roots


def _first_signalled(run: RunDir, statuses: dict[int, RankStatusDoc | None]) -> dict[int, str]:
    """rank -> signal for torchrun's first observed failure(s) that a signal ended; read only when a rank is silent."""
    if all(s is not None for s in statuses.values()):
        return {}
    signals, roots = torchrun_signals(run)
    return {r: signals[r] for r in roots if r in signals}


def torn_down_ranks(run: RunDir, statuses: dict[int, RankStatusDoc | None]) -> set[int]:
    """Silent ranks (no status) whose process torchrun's agent stopped itself after another worker ended, read from
    its log (RUN/torchrun/**/torchrun.log) and the ranks' info.json pids. A rank stopped before its probe wrote
    info.json (still starting while another rank already failed) is known by that log's failure table instead:
    ended by SIGTERM, torchrun's closing signal, and not the first observed failure."""
    from ddpdoctor import safe_io
    from ddpdoctor.errors import BadInput
    from ddpdoctor.findings.crash import torchrun_stopped_pids
    from ddpdoctor.logs.launchers import torchrun_failures
    from ddpdoctor.logs.lines import split_lines

    silent = [r for r, s in statuses.items() if s is None]
    if not silent:
        return set()
    pids: set[int] = set()
    by_table: set[int] = set()
    for log in sorted(run.torchrun_logs.glob("**/torchrun.log"))[:64]:
        try:
            text = safe_io.read_bytes(log, 64 << 20, decompress=False).decode(errors="replace")
        except (OSError, BadInput):
            continue
        stopped = torchrun_stopped_pids(text)
        pids |= stopped
        if stopped:  # the table is at the log's end (as torchrun_signals reads it)
            failures, _ = torchrun_failures(split_lines(str(log), text[-(256 << 10):]))
            by_table |= {f.rank for f in failures
                         if f.rank is not None and f.signal == "SIGTERM" and not f.is_root_cause}
    out = set()
    for r in silent:
        path = run.rank_file(r, "info.json")
        info = artefacts.load(path, RankInfo) if path.exists() else None
        if (info.pid in pids) if info is not None else (r in by_table):
            out.add(r)
    return out


def hang_verdict(hang: Hang, report_path: str) -> HangVerdict:
    """The hang section from RUN/hang.json: when, the culprit, where each rank stood (or, multi-node, the classes
    of ranks that share a state and a stack, outliers first)."""
    d = hang.diagnosis
    return HangVerdict(
        detected_after_s=hang.detected_after_s, hang_timeout_s=hang.hang_timeout_s, on_hang=hang.on_hang,
        kind=d.kind, culprit_ranks=d.culprit_ranks, report=report_path,
        ranks={str(r): _where(p) for r, p in sorted(d.positions.items())},
        classes=[HangClassJson(count=c.count, ranks=c.ranks, state=c.state, nodes=c.nodes) for c in hang.classes]
        if hang.classes else None)


def monitor_notes(heartbeats: Heartbeats | None) -> list[str]:
    """What the monitor refused: connections without the job's token, or messages over its limits."""
    rejected = ((heartbeats.monitor if heartbeats else None) or {}).get("rejected") or {}
    if not isinstance(rejected, dict) or not rejected:
        return []
    total = sum(v for v in rejected.values() if isinstance(v, int))
    parts = ", ".join(f"{k} {v}" for k, v in sorted(rejected.items()) if isinstance(v, int))
    return [f"The heartbeat monitor dropped {total} connection(s) or message(s) that were not the job's ({parts}); "
            "see docs/trust.md."]


def watch_findings(run: RunDir, debug: bool = False, stopped: bool = False) -> list[Finding]:
    """Findings from RUN/hang.json, the ranks' status files and (with --debug) their stderr. ``stopped``: ddpdoctor
    was stopped by a signal and stopped the job, so ranks that died of that stop are not crashes."""
    from ddpdoctor.findings.crash import crash_findings, is_victim
    from ddpdoctor.findings.hang import hang_findings, stall_findings

    findings: list[Finding] = []
    statuses = rank_statuses(run)
    hang = hang_doc(run)
    heartbeats = heartbeats_doc(run)
    stderr = {r: rank_text(run, r, "stderr.log") or "" for r, s in statuses.items() if s is None}
    beats = {int(r): v.get("beat") for r, v in ((heartbeats.get("ranks") if heartbeats else None) or {}).items()}
    infos = _infos(run)
    crashes = crash_findings(statuses, debug=debug, param_names=_param_names(infos), stderr=stderr, last_beats=beats,
                             torn_down=torn_down_ranks(run, statuses), ddp_cfg=_ddp_cfg(infos),
                             oom_kills=_oom_kills(run), first_signalled=_first_signalled(run, statuses),
                             ddp=_maybe_ddp(infos))

    if hang is not None or stopped:  # ranks ddpdoctor stopped did not leave of their own accord
        crashes = [f for f in crashes if f.id != "rank-left-early"]
    if hang is not None:
        told = next((f for f in crashes if f.id == "collective-mismatch" and "culprit_ranks" in f.evidence), None)
        findings.extend(hang_findings(hang, debug=debug, aborted_mismatch=told))
        # After a hang, ranks killed by ddpdoctor are victims, not crashes.
        crashes = [f for f in crashes if f.id != "rank-crashed" or "SIGTERM" not in str(f.evidence.get("exception"))]
    diverged = _divergence(run)
    if diverged:  # ranks that --on-divergence stop stopped did not crash; a hang that followed points to it
        crashes = [f for f in crashes if "DivergenceStopped" not in str(f.evidence.get("exception"))]
        step = diverged[0].evidence.get("step")
        note = f" (the ranks had diverged at step {step} before: see the divergence finding)"
        findings = diverged + [dataclasses.replace(f, title=f.title + note) if f.id == "hang" else f for f in findings]
    stalls = (heartbeats["monitor"].get("stalls") if heartbeats and heartbeats.get("monitor") else None) or []
    findings.extend(stall_findings(stalls if isinstance(stalls, list) else []))
    if stopped:
        crashes = [f for f in crashes if f.id != "rank-crashed" or not is_victim(str(f.evidence.get("exception")))]
    if diverged:  # a crash that followed (DDP's "Expected to have finished reduction" after a frozen layer) too
        crashes = [dataclasses.replace(f, title=f.title + note) if f.id == "rank-crashed" else f for f in crashes]
    have = {f.id for f in findings}
    findings.extend(f for f in crashes if f.id in ("rank-crashed", "rank-left-early") or f.id not in have)
    if debug:
        findings.extend(debug_findings(run, have={f.id for f in findings}))
    return findings


def _divergence(run: RunDir) -> list[Finding]:
    """RUN/divergence.json (job/divergence.py): the first step at which ranks' fingerprints differed."""
    from ddpdoctor.errors import BadInput
    from ddpdoctor.findings.divergence import divergence_findings
    from ddpdoctor.rundir.layout import read_json

    path = run.root / "divergence.json"
    try:
        doc = read_json(path) if path.is_file() else None
    except (OSError, BadInput):
        return []
    return divergence_findings(doc)


def _oom_kills(run: RunDir) -> int | None:
    """How many times the host's OOM killer fired between the launch and the end (the manifest's /proc/vmstat
    counts); None when either is unknown."""
    from ddpdoctor.rundir import artefacts

    try:
        data = artefacts.load_dict(run.manifest)
    except Exception:  # noqa: BLE001 - a manifest that cannot be read only loses this hint
        return None
    start, end = data.get("oom_kills_at_start"), data.get("oom_kills_at_end")
    if isinstance(start, int) and isinstance(end, int) and end >= start:
        return end - start
    return None


def debug_findings(run: RunDir, have: set[str]) -> list[Finding]:
    """What TORCH_DISTRIBUTED_DEBUG=DETAIL printed, explained by the logs parsers (ddpdoctor/logs)."""
    from ddpdoctor.logs.explain import explain_texts

    # Named relative to the run directory: "ranks/rank3/stderr.log" tells the parsers the rank.
    texts = {str(run.rank_file(r, "stderr.log").relative_to(run.root)): text for r in run.ranks_present()
             if (text := rank_text(run, r, "stderr.log", missing=None)) is not None}
    try:
        found = list(explain_texts(texts))
    except Exception:  # noqa: BLE001 - the report of the run matters more than the log explanation
        return []
    # The watch already named these from richer sources (heartbeats, status files); "job-failed" is implied.
    if have & {"hang", "rank-crashed", "collective-mismatch"}:
        # ... and so are the logs' victim-side findings (closed connections, store resets, unexplained errors).
        have = have | {"job-failed", "peer-lost", "store-failure", "unrecognised-failure"}
    return [f for f in found if f.id not in have]


def _infos(run: RunDir) -> dict[int, RankInfo]:
    """Each rank's info.json, typed (ranks that wrote none are left out)."""
    from ddpdoctor.rundir import artefacts

    return {r: info for r in run.ranks_present()
            if (info := artefacts.load_optional(run.rank_file(r, "info.json"), RankInfo)) is not None}


def _param_names(infos: dict[int, RankInfo]) -> dict[int, list[str]]:
    """Each rank's DDP parameter names in reducer order (to name DDP's "parameter indices")."""
    return {r: [p.name for p in info.ddp_modules[0].parameters] for r, info in infos.items() if info.ddp_modules}


def _maybe_ddp(infos: dict[int, RankInfo]) -> bool:
    """False only when the ranks recorded what they built and none built a DDP module (an FSDP2 or DTensor job):
    then no rule reads a rank in backward() as DDP's bucket all-reduce."""
    recorded = [info.parallelism for info in infos.values() if info.parallelism is not None]
    return not recorded or any(info.ddp_modules for info in infos.values()) or any(
        p.ddp_modules or "ddp" in p.kinds for p in recorded)


def _ddp_cfg(infos: dict[int, RankInfo]) -> DDPModule | None:
    """The lowest rank's first DDP module description (its options and ``built_by``), for advice in its terms."""
    return next((info.ddp_modules[0] for _, info in sorted(infos.items()) if info.ddp_modules), None)


def _where(p: Position) -> str:
    """One line: where a rank stood when the hang was detected."""
    if p.state == "in-collective":
        seq = f" #{p.seq}" if p.seq is not None else ""
        what = f"in {p.op}{seq} on {p.group}" + (f" sizes {p.sizes}" if p.sizes else "")
    else:
        what = f"{p.state} (phase {p.phase})"
    return f"{what}, step {p.step}, at {p.call_site}"

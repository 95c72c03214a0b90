"""The report of a watched run (run, profile, check-sync): job findings plus hang, crash and --debug findings.

Reads RUN/hang.json, RUN/heartbeats.json and the ranks' status/stderr files; the rules live in findings/hang.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ddpdoctor.findings.job import ended_findings
from ddpdoctor.findings.model import Finding
from ddpdoctor.launch import runlock
from ddpdoctor.report import Report
from ddpdoctor.rundir import manifest as manifest_mod
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.report import job_report, rank_statuses


def watched_report(run: RunDir, command: str, debug: bool = False, analyse_traces: bool = False) -> Report:
    """job_report plus the hang/crash findings of a watched run (also used by `profile`)."""
    report = job_report(run, command, analyse_traces=analyse_traces)
    ended, report.stopped = ended_findings(manifest_mod.load(run), runlock.is_locked(run.root))
    report.findings.extend(ended)
    report.findings.extend(watch_findings(run, debug=debug, stopped=report.stopped is not None))
    hang = _read(run.root / "hang.json")
    if hang is not None:
        d = hang.get("diagnosis") or {}
        report.sections["hang"] = {k: hang.get(k) for k in ("detected_after_s", "hang_timeout_s", "on_hang")}
        report.sections["hang"].update(
            kind=d.get("kind"), culprit_ranks=d.get("culprit_ranks"), report=str(run.root / "hang.txt"),
            ranks={r: _where(p) for r, p in sorted((d.get("positions") or {}).items(), key=lambda kv: int(kv[0]))},
        )
        # Ranks killed because of the hang write no status: that is not a separate problem.
        report.findings = [f for f in report.findings if f.id != "rank-no-status"]
    if report.stopped is not None:  # nor ranks killed because ddpdoctor was stopped
        report.findings = [f for f in report.findings if f.id != "rank-no-status"]
    report.notes.extend(monitor_notes(_read(run.root / "heartbeats.json") or {}))
    crashed = {r for f in report.findings if f.id == "rank-crashed" for r in f.ranks}
    # A rank that died is named by rank-crashed (with what its stderr said): its "no status" is the same event.
    report.findings = [f for f in report.findings if f.id != "rank-no-status" or not set(f.ranks) <= crashed]
    return report


def monitor_notes(heartbeats: dict[str, Any]) -> list[str]:
    """What the monitor refused: connections without the job's token, or messages over its limits."""
    rejected = (heartbeats.get("monitor") or {}).get("rejected") or {}
    if not isinstance(rejected, dict) or not rejected:
        return []
    total = sum(v for v in rejected.values() if isinstance(v, int))
    parts = ", ".join(f"{k} {v}" for k, v in sorted(rejected.items()) if isinstance(v, int))
    return [f"The heartbeat monitor dropped {total} connection(s) or message(s) that were not the job's ({parts}); "
            "see docs/trust.md."]


def watch_findings(run: RunDir, debug: bool = False, stopped: bool = False) -> list[Finding]:
    """Findings from RUN/hang.json, the ranks' status files and (with --debug) their stderr. ``stopped``: ddpdoctor
    was stopped by a signal and stopped the job, so ranks that died of that stop are not crashes."""
    from ddpdoctor.findings.hang import crash_findings, hang_findings, is_victim, stall_findings

    findings: list[Finding] = []
    statuses = rank_statuses(run)
    hang = _read(run.root / "hang.json")
    stderr = {r: _text(run.rank_file(r, "stderr.log")) for r, s in statuses.items() if s is None}
    beats = {int(r): v.get("beat") for r, v in ((_read(run.root / "heartbeats.json") or {}).get("ranks") or {}).items()}
    crashes = crash_findings(statuses, debug=debug, param_names=_param_names(run), stderr=stderr, last_beats=beats)

    if hang is not None or stopped:  # ranks ddpdoctor stopped did not leave of their own accord
        crashes = [f for f in crashes if f.id != "rank-left-early"]
    if hang is not None:
        findings.extend(hang_findings(hang, debug=debug))
        # After a hang, ranks killed by ddpdoctor are victims, not crashes.
        crashes = [f for f in crashes if f.id != "rank-crashed" or "SIGTERM" not in str(f.evidence.get("exception"))]
    stalls = ((_read(run.root / "heartbeats.json") or {}).get("monitor") or {}).get("stalls") or []
    findings.extend(stall_findings(stalls if isinstance(stalls, list) else []))
    if stopped:
        crashes = [f for f in crashes if f.id != "rank-crashed" or not is_victim(str(f.evidence.get("exception")))]
    have = {f.id for f in findings}
    findings.extend(f for f in crashes if f.id in ("rank-crashed", "rank-left-early") or f.id not in have)
    if debug:
        findings.extend(debug_findings(run, have={f.id for f in findings}))
    return findings


def debug_findings(run: RunDir, have: set[str]) -> list[Finding]:
    """What TORCH_DISTRIBUTED_DEBUG=DETAIL printed, explained by the logs parsers (ddpdoctor/logs)."""
    from ddpdoctor.logs.explain import explain_texts

    texts: dict[str, str] = {}
    for r in run.ranks_present():
        path = run.rank_file(r, "stderr.log")
        try:
            # Named relative to the run directory: "ranks/rank3/stderr.log" tells the parsers the rank.
            texts[str(path.relative_to(run.root))] = path.read_text(errors="replace")
        except (OSError, ValueError):
            continue
    try:
        found = list(explain_texts(texts))
    except Exception:  # noqa: BLE001 - the report of the run matters more than the log explanation
        return []
    # The watch already named these from richer sources (heartbeats, status files); "job-failed" is implied.
    if have & {"hang", "rank-crashed", "collective-mismatch"}:
        # ... and so are the logs' victim-side findings (closed connections, store resets, unexplained errors).
        have = have | {"job-failed", "peer-lost", "store-failure", "unrecognised-failure"}
    return [f for f in found if f.id not in have]


def _param_names(run: RunDir) -> dict[int, list[str]]:
    """Each rank's DDP parameter names in reducer order (to name DDP's "parameter indices")."""
    out: dict[int, list[str]] = {}
    for r in run.ranks_present():
        info = _read(run.rank_file(r, "info.json")) or {}
        mods = info.get("ddp_modules") or []
        if mods:
            out[r] = [p["name"] for p in mods[0].get("parameters", [])]
    return out


def _where(p: dict[str, Any]) -> str:
    """One line: where a rank stood when the hang was detected."""
    if p.get("state") == "in-collective":
        seq = f" #{p['seq']}" if p.get("seq") is not None else ""
        what = f"in {p.get('op')}{seq} on {p.get('group')}" + (f" sizes {p['sizes']}" if p.get("sizes") else "")
    else:
        what = f"{p.get('state')} (phase {p.get('phase')})"
    return f"{what}, step {p.get('step')}, at {p.get('call_site')}"


def render_hang_section(report: Report, out: Any, verbose: bool) -> None:
    """Terminal view of the hang section (the renderer's sections callback)."""
    from rich.markup import escape

    h = report.sections.get("hang")
    if not h:
        return
    out.print(f"[bold red]hang[/bold red] detected after {h.get('detected_after_s')} s without progress "
              f"(timeout {h.get('hang_timeout_s')} s); culprit rank(s): {h.get('culprit_ranks') or 'undetermined'}")
    for r, where in (h.get("ranks") or {}).items():
        out.print(f"  rank {escape(str(r))}: {escape(where)}")
    out.print(f"  stacks and Flight Recorder dumps: {escape(str(h.get('report')))} / hang.json")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None

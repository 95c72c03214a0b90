"""`ddpdoctor run`: launch like torchrun under hang and crash watch (no profiling); name the culprit rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import (
    LAUNCH_CONTEXT,
    cli_errors,
    default_run_dir,
    emit,
    fail_on_option,
    json_option,
    launch_options,
)
from ddpdoctor.findings.model import Finding
from ddpdoctor.launch.flags import pop_torchrun_values
from ddpdoctor.launch.launcher import LaunchSpec, launch
from ddpdoctor.launch.monitor import make_watcher, watch_options
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir, write_json
from ddpdoctor.rundir.report import job_report

DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__)
@launch_options
@watch_options
@click.option("--debug", is_flag=True, help="Set TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO; "
              "explain what they print.")
@click.option("--verbose", "-v", is_flag=True, help="Show the full evidence (stacks) of each finding.")
@json_option
@fail_on_option
@cli_errors
def command(
    script: str,
    script_args: tuple[str, ...],
    out: Path | None,
    name: str | None,
    launcher: str,
    quiet: bool,
    hang_timeout: float | None,
    startup_timeout: float,
    on_hang: str,
    debug: bool,
    verbose: bool,
    as_json: bool,
    fail_on: str,
    **kwargs: Any,
) -> None:
    spec = LaunchSpec(
        mode="run",
        script=script,
        script_args=list(script_args),
        run_dir=RunDir(out or default_run_dir(name)),
        torchrun=pop_torchrun_values(kwargs),
        launcher=launcher,
        options={"debug": debug},
        env=dict(DEBUG_ENV) if debug else {},
        quiet=quiet,
        output_to_stderr=as_json,
    )
    watcher = make_watcher(hang_timeout, startup_timeout, on_hang)
    result = launch(spec, watcher)
    report = watched_report(spec.run_dir, "run", debug=debug)
    # The contract is 0/1/2: a job that failed (or was killed for hanging) is a problem found.
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, exit_code=1 if result.exit_code else None)


def watched_report(run: RunDir, command: str, debug: bool = False, analyse_traces: bool = False) -> Report:
    """job_report plus the hang/crash findings of a watched run (also used by `profile`)."""
    report = job_report(run, command, analyse_traces=analyse_traces)
    report.findings.extend(watch_findings(run, debug=debug))
    hang = _read(run.root / "hang.json")
    if hang is not None:
        report.sections["hang"] = {k: hang.get(k) for k in ("detected_after_s", "hang_timeout_s", "on_hang")}
        report.sections["hang"]["report"] = str(run.root / "hang.txt")
        # Ranks killed because of the hang write no status: that is not a separate problem.
        report.findings = [f for f in report.findings if f.id != "rank-no-status"]
    crashed = {r for f in report.findings if f.id == "rank-crashed" for r in f.ranks}
    # A rank that died is named by rank-crashed (with what its stderr said): its "no status" is the same event.
    report.findings = [f for f in report.findings if f.id != "rank-no-status" or not set(f.ranks) <= crashed]
    write_json(run.root / "report.json", report.to_json())
    return report


def watch_findings(run: RunDir, debug: bool = False) -> list[Finding]:
    """Findings from RUN/hang.json, the ranks' status files and (with --debug) their stderr."""
    from ddpdoctor.findings.hang import crash_findings, hang_findings

    findings: list[Finding] = []
    statuses = {r: _read(run.rank_file(r, "status.json")) for r in run.ranks_present()}
    hang = _read(run.root / "hang.json")
    stderr = {r: _text(run.rank_file(r, "stderr.log")) for r, s in statuses.items() if s is None}
    beats = {int(r): v.get("beat") for r, v in ((_read(run.root / "heartbeats.json") or {}).get("ranks") or {}).items()}
    crashes = crash_findings(statuses, debug=debug, param_names=_param_names(run), stderr=stderr, last_beats=beats)

    if hang is not None:
        findings.extend(hang_findings(hang, debug=debug))
        # After a hang, ranks killed by ddpdoctor are victims, not crashes.
        crashes = [f for f in crashes if f.id != "rank-crashed" or "SIGTERM" not in str(f.evidence.get("exception"))]
    have = {f.id for f in findings}
    findings.extend(f for f in crashes if f.id == "rank-crashed" or f.id not in have)
    if debug:
        findings.extend(debug_findings(run, have={f.id for f in findings}))
    return findings


def debug_findings(run: RunDir, have: set[str]) -> list[Finding]:
    """What TORCH_DISTRIBUTED_DEBUG=DETAIL printed, explained by the logs parsers (when installed)."""
    try:
        from ddpdoctor.logs.explain import explain_texts  # type: ignore[import-not-found]
    except ImportError:
        return []
    texts: dict[str, str] = {}
    for r in run.ranks_present():
        path = run.rank_file(r, "stderr.log")
        try:
            texts[str(path)] = path.read_text(errors="replace")
        except OSError:
            continue
    try:
        found = list(explain_texts(texts))
    except Exception:  # noqa: BLE001 - the report of the run matters more than the log explanation
        return []
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

"""`ddpdoctor capture RUN`: ask a job running under `ddpdoctor run` to profile its next N iterations on every rank
(a window folder RUN/captures/<id>, analysed and reported like `profile`), to fingerprint and compare its next N
iterations across ranks (like `check-sync`), or to dump every rank's stack, grouped.
The job goes on unaffected. Only the job's owner can ask (the request goes through the run's private control
folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors, emit, json_option

# The same layout as h17's `_common.examples` (click keeps a "\b" paragraph as written).
EXAMPLES = ("\b\nExamples:\n  ddpdoctor capture ddpdoctor-runs/job42 --profile 5\n"
            "  ddpdoctor capture ddpdoctor-runs/job42 --check-sync 3 --json\n"
            "  ddpdoctor capture ddpdoctor-runs/job42 --stacks")


@click.command(help=__doc__, epilog=EXAMPLES)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--profile", "profile_steps", type=click.IntRange(1, 100), default=None, metavar="N",
              help="Profile the next N iterations on every rank.")
@click.option("--stacks", is_flag=True, help="Dump every rank's Python stack now, grouped into classes.")
@click.option("--check-sync", "sync_steps", type=click.IntRange(1, 100), default=None, metavar="N",
              help="Fingerprint gradients, parameters and buffers of the next N iterations on every rank and "
                   "compare them across ranks (as `ddpdoctor check-sync`, without stopping the job).")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the capture.")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
@json_option
@click.option("--fail-on", type=click.Choice(["error", "warning", "none"]), default="error", show_default=True,
              help="Exit 1 when a finding of this severity or worse is found (none: only a failed capture fails).")
@cli_errors
def command(run_dir: Path, profile_steps: int | None, stacks: bool, sync_steps: int | None, timeout: float,
            verbose: bool, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.errors import BadInput
    from ddpdoctor.live import capture
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.report import save_report

    asked = {"profile": profile_steps, "check-sync": sync_steps, "stacks": stacks or None}
    chosen = [k for k, v in asked.items() if v is not None]
    if len(chosen) != 1:
        raise BadInput("give exactly one of --profile N, --check-sync N or --stacks")
    what = chosen[0]
    steps = profile_steps if what == "profile" else sync_steps
    cid, nodes = capture.request(run_dir, what, steps)
    try:
        state = capture.wait_picked_up(run_dir, cid, nodes)
        if what == "stacks":
            path = capture.wait_stacks(run_dir, cid, state["nodes"], timeout)
            from ddpdoctor.safe_io import clean_text

            click.echo(clean_text(path.read_text(errors="replace")), nl=False)
            click.echo(f"ddpdoctor: stacks in {path}", err=True)
            sys.exit(0)
        window = capture.wait_window(run_dir, cid, state, timeout)
    except capture.CaptureFailed as exc:
        click.echo(f"ddpdoctor: capture {cid}: {exc}", err=True)
        sys.exit(1)
    click.echo(f"ddpdoctor: window of {steps} iteration(s) in {window}", err=True)
    note = capture.misaligned_note(window, state["ranks"])
    relayed = capture.relay_note(window)
    if relayed:
        note = f"{note}; {relayed}" if note else relayed
    if state.get("missing_nodes"):
        lost = (f"{', '.join(state['missing_nodes'])} did not take the request (through the job store): their ranks "
                "are not in this window")
        note = f"{note}; {lost}" if note else lost
    from ddpdoctor.reports import capture as capture_report

    if what == "check-sync":
        from ddpdoctor.renderers.console_sync import render_sync_sections

        report = capture_report.assemble_check_sync(RunDir(window), note)
        save_report(RunDir(window), report)
        emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_sync_sections)
    from ddpdoctor.renderers.console_perf import render_perf_sections
    from ddpdoctor.renderers.outputs import write_outputs

    run = RunDir(window)
    report = capture_report.assemble_profile(run, note)
    save_report(run, report)
    write_outputs(report, window, None, None, run.trace_files())
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_perf_sections)

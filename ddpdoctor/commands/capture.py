"""`ddpdoctor capture RUN`: ask a job running under `ddpdoctor run` to profile its next N iterations on every rank
(a window folder RUN/captures/<id>, analysed and reported like `profile`), or to dump every rank's stack, grouped.
The job goes on unaffected. Only the job's owner can ask (the request goes through the run's private control
folder)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors, emit, json_option, launch_fail_on_option


@click.command(help=__doc__)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--profile", "profile_steps", type=click.IntRange(1, 100), default=None, metavar="N",
              help="Profile the next N iterations on every rank.")
@click.option("--stacks", is_flag=True, help="Dump every rank's Python stack now, grouped into classes.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the capture.")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
@json_option
@launch_fail_on_option  # like profile: the findings are advice; --fail-on gates
@cli_errors
def command(run_dir: Path, profile_steps: int | None, stacks: bool, timeout: float, verbose: bool, as_json: bool,
            fail_on: str) -> None:
    from ddpdoctor.errors import BadInput
    from ddpdoctor.live import capture

    if (profile_steps is None) == (not stacks):
        raise BadInput("give exactly one of --profile N or --stacks")
    what = "profile" if profile_steps is not None else "stacks"
    cid = capture.request(run_dir, what, profile_steps)
    try:
        state = capture.wait_picked_up(run_dir, cid)
        if what == "stacks":
            path = capture.wait_stacks(run_dir, cid, timeout)
            from ddpdoctor.safe_io import clean_text

            click.echo(clean_text(path.read_text(errors="replace")), nl=False)
            click.echo(f"ddpdoctor: stacks in {path}", err=True)
            sys.exit(0)
        window = capture.wait_profile(run_dir, cid, state, timeout)
    except capture.CaptureFailed as exc:
        click.echo(f"ddpdoctor: capture {cid}: {exc}", err=True)
        sys.exit(1)
    from ddpdoctor.analyses.pipeline import analyze_run
    from ddpdoctor.renderers.console_perf import render_perf_sections
    from ddpdoctor.renderers.outputs import write_outputs
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.report import save_report

    run = RunDir(window)
    report = analyze_run(run)
    report.command = "capture"
    report.sections["run_dir"] = str(window)
    save_report(run, report)
    write_outputs(report, window, None, None, run.trace_files())
    click.echo(f"ddpdoctor: window of {profile_steps} iteration(s) in {window}", err=True)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_perf_sections)

"""`ddpdoctor profile`: launch like torchrun, profile a few steps on every rank, then analyse and report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import (
    LAUNCH_CONTEXT,
    cli_errors,
    emit,
    examples,
    fail_on_option,
    finish_quietly,
    job_report_elsewhere,
    json_option,
    launch_options,
    node_of,
    pop_launch_spec,
    share_job_report,
)
from ddpdoctor.commands._watch import divergence_option, pop_watcher, watch_options
from ddpdoctor.errors import BadInput
from ddpdoctor.launch.launcher import launch
from ddpdoctor.launch.runlock import is_locked
from ddpdoctor.probes.config import Schedule
from ddpdoctor.renderers import progress
from ddpdoctor.renderers.outputs import write_outputs
from ddpdoctor.reports.profile import assemble
from ddpdoctor.rundir.report import save_report_or_problem
from ddpdoctor.terminal_text import one_line


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__, epilog=examples(
    "ddpdoctor profile --nproc-per-node 2 train.py --epochs 1",
    "ddpdoctor profile --nproc-per-node 4 --name baseline --html report.html train.py",
    "ddpdoctor profile --nnodes 2 --node-rank 0 --rdzv-endpoint head:29500 --nproc-per-node 8 train.py",
))
@launch_options
@watch_options
@divergence_option
@click.option("--wait", default=2, show_default=True, help="Steps to skip before profiling (DDP builds buckets in step 0).")
@click.option("--warmup", default=1, show_default=True, help="Profiler warm-up steps (recorded, then discarded).")
@click.option("--active", default="auto", show_default=True,
              help="Steps recorded: a number, or auto (until the step-time interval is within ±10%, 5 to 20 steps).")
@click.option("--repeat", default=1, show_default=True, help="How many wait/warmup/active cycles.")
@click.option("--run-to-completion", is_flag=True,
              help="Keep training after the profiled window (default: every rank stops once its steps are written).")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (bigger traces).")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Also write the HTML report here (RUN/report.html is always written).")
@click.option("--merge", "merge_path", type=click.Path(path_type=Path), default=None,
              help="Write all ranks' traces as one Perfetto/Chrome trace (e.g. merged.json.gz).")
@click.option("--nccl-debug", is_flag=True,
              help="Capture NCCL_DEBUG=INFO output and a topology dump; add the fabric checks of `ddpdoctor topo`.")
@click.option("--baseline", type=click.Path(path_type=Path, exists=True), default=None,
              help="A run directory to compare with: the report adds `ddpdoctor diff BASELINE RUN` (docs/diff.md).")
@json_option
@fail_on_option
@cli_errors
def command(
    wait: int,
    warmup: int,
    active: str,
    repeat: int,
    run_to_completion: bool,
    with_stack: bool,
    verbose: bool,
    html_path: Path | None,
    merge_path: Path | None,
    nccl_debug: bool,
    baseline: Path | None,
    as_json: bool,
    fail_on: str,
    **kwargs: Any,
) -> None:
    watcher = pop_watcher(kwargs)
    spec = pop_launch_spec(
        "profile", kwargs, as_json=as_json,
        schedule=_schedule(wait, warmup, active, repeat),
        options={"with_stack": with_stack, "nccl_debug": nccl_debug, "run_to_completion": run_to_completion},
    )
    show = progress.enabled(as_json)
    result = launch(spec, progress.with_progress(watcher, spec.torchrun, as_json, spec.schedule))
    if not result.reports:
        job_report_elsewhere(result, as_json=as_json, verbose=verbose, fail_on=fail_on, command="profile")
        finish_quietly(result)
    traces = spec.run_dir.trace_files()
    progress.say(f"analysing {len(traces)} trace(s), {sum(p.stat().st_size for p in traces) / 1e6:.1f} MB", show)
    report = assemble(spec.run_dir, spec.schedule, locked=is_locked(spec.run_dir.root), nccl_debug=nccl_debug,
                      baseline=baseline, node=node_of(result))
    share_job_report(result, report)  # a job of several nodes: every node prints this report
    problem = save_report_or_problem(spec.run_dir, report)
    if problem:  # a full disk: the report is printed below all the same, and the job's verdict is the exit code
        click.echo(f"ddpdoctor: warning: {one_line(problem)}; the report is complete below", err=True)
    if result.exit_code == 0 and not spec.run_dir.trace_files() and any(f.id == "no-steps-seen" for f in report.findings):
        raise BadInput(
            "no training iteration was seen on any rank (no optimizer step and no ddpdoctor.step()), so nothing "
            "was profiled; call ddpdoctor.step() at the end of each iteration",
            spec.script,
        )
    # The run directory is also the HTML report's home and a TensorBoard log dir (RUN/scalars/rankR). When only
    # those cannot be written (a full disk), the job's verdict still decides the exit code: report.json holds the
    # report, and one line says what is missing. What the user asked for (--html, --merge) must be written.
    try:
        write_outputs(report, spec.run_dir.root, None, None, [], show_progress=show)
    except BadInput as exc:
        click.echo(f"ddpdoctor: warning: {exc}; the report is complete in report.json and below", err=True)
    if html_path or merge_path:
        write_outputs(report, None, html_path, merge_path, spec.run_dir.trace_files(), show_progress=show)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, exit_code=result.exit_code or None)


def _schedule(wait: int, warmup: int, active: str, repeat: int) -> Schedule:
    try:
        return Schedule.parse_active(active, wait=wait, warmup=warmup, repeat=repeat)
    except ValueError as exc:
        raise BadInput(str(exc)) from None

"""`ddpdoctor run`: launch like torchrun under hang and crash watch (no profiling); name the culprit rank."""

from __future__ import annotations

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
from ddpdoctor.commands._live_options import live_options, node_name, pop_live
from ddpdoctor.commands._watch import divergence_option, pop_watcher, watch_options
from ddpdoctor.launch.launcher import launch
from ddpdoctor.launch.runlock import is_locked
from ddpdoctor.renderers import progress
from ddpdoctor.reports.run import assemble
from ddpdoctor.rundir.report import save_report_or_problem
from ddpdoctor.terminal_text import one_line

DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__, epilog=examples(
    "ddpdoctor run --nproc-per-node 2 train.py --epochs 1",
    "ddpdoctor run --nproc-per-node 8 --hang-timeout 300 --debug train.py",
))
@launch_options
@watch_options
@divergence_option
@live_options
@click.option("--debug", is_flag=True, help="Set TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO; "
              "explain what they print.")
@click.option("--verbose", "-v", is_flag=True, help="Show the full evidence (stacks) of each finding.")
@click.option("--nccl-debug", is_flag=True,
              help="Capture NCCL_DEBUG=INFO output and a topology dump; add the fabric checks of `ddpdoctor topo`.")
@json_option
@fail_on_option
@cli_errors
def command(debug: bool, verbose: bool, nccl_debug: bool, as_json: bool, fail_on: str, **kwargs: Any) -> None:
    watcher = pop_watcher(kwargs)
    live = pop_live(kwargs)  # live step health, alerts, `status`/`capture`, exporters (ddpdoctor/live)
    watcher.plugins.append(live)
    spec = pop_launch_spec("run", kwargs, as_json=as_json, options={"debug": debug, "nccl_debug": nccl_debug},
                           env=dict(DEBUG_ENV) if debug else {})
    live.node = node_name(spec)
    result = launch(spec, progress.with_progress(watcher, spec.torchrun, as_json))
    if not result.reports:
        job_report_elsewhere(result, as_json=as_json, verbose=verbose, fail_on=fail_on)
        finish_quietly(result)
    report = assemble(spec.run_dir, locked=is_locked(spec.run_dir.root), debug=debug, nccl_debug=nccl_debug,
                      node=node_of(result))
    share_job_report(result, report)  # a job of several nodes: every node prints this report
    problem = save_report_or_problem(spec.run_dir, report)
    if problem:  # a full disk: the report is printed below all the same, and the job's verdict is the exit code
        click.echo(f"ddpdoctor: warning: {one_line(problem)}; the report is complete below", err=True)
    # The contract is 0/1/2: a job that failed (or was killed for hanging) is a problem found.
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on,
         exit_code=1 if result.exit_code else None)


def _sections(report: Any, out: Any, verbose: bool) -> None:
    """Moved to ddpdoctor/renderers/views.py (the view a report with a hang section gets)."""
    from ddpdoctor.renderers.views import BY_COMMAND

    BY_COMMAND["run"](report, out, verbose)

"""`ddpdoctor run`: launch like torchrun under hang and crash watch (no profiling); name the culprit rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import (
    LAUNCH_CONTEXT,
    cli_errors,
    default_run_dir,
    emit,
    fail_on_option,
    finish_quietly,
    json_option,
    launch_options,
)
from ddpdoctor.findings.watched import render_hang_section, watched_report
from ddpdoctor.launch.flags import pop_torchrun_values
from ddpdoctor.launch.launcher import LaunchSpec, launch
from ddpdoctor.launch.monitor import make_watcher, watch_options
from ddpdoctor.rundir.layout import RunDir

DEBUG_ENV = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "TORCH_CPP_LOG_LEVEL": "INFO"}


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__)
@launch_options
@watch_options
@click.option("--debug", is_flag=True, help="Set TORCH_DISTRIBUTED_DEBUG=DETAIL and TORCH_CPP_LOG_LEVEL=INFO; "
              "explain what they print.")
@click.option("--verbose", "-v", is_flag=True, help="Show the full evidence (stacks) of each finding.")
@click.option("--nccl-debug", is_flag=True,
              help="Capture NCCL_DEBUG=INFO output and a topology dump; add the fabric checks of `ddpdoctor topo`.")
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
    overwrite: bool,
    hang_timeout: float | None,
    startup_timeout: float,
    on_hang: str,
    debug: bool,
    verbose: bool,
    nccl_debug: bool,
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
        overwrite=overwrite,
    )
    if nccl_debug:
        from ddpdoctor.topo.capture import job_env

        spec.env.update(job_env(spec.run_dir.root))
    watcher = make_watcher(hang_timeout, startup_timeout, on_hang)
    result = launch(spec, watcher)
    if not result.reports:
        finish_quietly(result)
    report = watched_report(spec.run_dir, "run", debug=debug)
    if nccl_debug:
        from ddpdoctor.topo.capture import add_to_report

        add_to_report(report, spec.run_dir)
    # The contract is 0/1/2: a job that failed (or was killed for hanging) is a problem found.
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_hang_section,
         exit_code=1 if result.exit_code else None)

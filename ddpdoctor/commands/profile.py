"""`ddpdoctor profile`: launch like torchrun, profile a few steps on every rank, then analyse and report."""

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
    json_option,
    launch_options,
)
from ddpdoctor.findings.watched import watched_report
from ddpdoctor.launch.flags import pop_torchrun_values
from ddpdoctor.launch.launcher import LaunchSpec, launch
from ddpdoctor.launch.monitor import make_watcher, watch_options
from ddpdoctor.probes.config import Schedule
from ddpdoctor.rundir.layout import RunDir


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__)
@launch_options
@watch_options
@click.option("--wait", default=2, show_default=True, help="Steps to skip before profiling (DDP builds buckets in step 0).")
@click.option("--warmup", default=1, show_default=True, help="Profiler warm-up steps (recorded, then discarded).")
@click.option("--active", default=3, show_default=True, help="Steps recorded.")
@click.option("--repeat", default=1, show_default=True, help="How many wait/warmup/active cycles.")
@click.option("--with-stack", is_flag=True, help="Record Python stacks in the trace (bigger traces).")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
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
    wait: int,
    warmup: int,
    active: int,
    repeat: int,
    with_stack: bool,
    verbose: bool,
    as_json: bool,
    fail_on: str,
    hang_timeout: float | None,
    startup_timeout: float,
    on_hang: str,
    **kwargs: Any,
) -> None:
    spec = LaunchSpec(
        mode="profile",
        script=script,
        script_args=list(script_args),
        run_dir=RunDir(out or default_run_dir(name)),
        torchrun=pop_torchrun_values(kwargs),
        launcher=launcher,
        schedule=Schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
        options={"with_stack": with_stack},
        quiet=quiet,
        output_to_stderr=as_json,
    )
    result = launch(spec, make_watcher(hang_timeout, startup_timeout, on_hang))
    report = watched_report(spec.run_dir, "profile", analyse_traces=True)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, exit_code=result.exit_code or None)

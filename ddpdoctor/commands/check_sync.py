"""`ddpdoctor check-sync`: launch like torchrun, check K steps for cross-rank agreement and data sharding, stop, report."""

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
from ddpdoctor.launch.flags import pop_torchrun_values
from ddpdoctor.launch.monitor import make_watcher, watch_options
from ddpdoctor.sync_api import render_sync_sections, run_check_sync


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__)
@launch_options
@watch_options
@click.option("--steps", default=5, show_default=True, type=int,
              help="Training steps to check; then every rank stops cleanly. 0: run the script to its end.")
@click.option("--equivalence", is_flag=True,
              help="For one step, compare DDP's averaged gradient with one process's gradient on all ranks' batches.")
@click.option("--verbose", "-v", is_flag=True, help="Every finding's full evidence.")
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
    steps: int,
    equivalence: bool,
    verbose: bool,
    as_json: bool,
    fail_on: str,
    **kwargs: Any,
) -> None:
    report, job_exit = run_check_sync(
        script,
        list(script_args),
        run_dir=out or default_run_dir(name),
        torchrun=pop_torchrun_values(kwargs),
        steps=steps,
        equivalence=equivalence,
        launcher=launcher,
        quiet=quiet,
        output_to_stderr=as_json,
        overwrite=overwrite,
        watcher=make_watcher(hang_timeout, startup_timeout, on_hang),
    )
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_sync_sections,
         exit_code=job_exit or None)

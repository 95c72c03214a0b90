"""`ddpdoctor check-sync`: launch like torchrun, check K steps for cross-rank agreement and data sharding, stop, report."""

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
    json_option,
    launch_options,
    pop_launch_spec,
)
from ddpdoctor.commands._watch import divergence_option, pop_watcher, watch_options
from ddpdoctor.renderers import progress
from ddpdoctor.sync_api import run_check_sync


@click.command(context_settings=LAUNCH_CONTEXT, help=__doc__, epilog=examples(
    "ddpdoctor check-sync --nproc-per-node 2 train.py",
    "ddpdoctor check-sync --nproc-per-node 2 --steps 3 --equivalence train.py --lr 0.1",
))
@launch_options
@watch_options
@divergence_option
@click.option("--steps", default=5, show_default=True, type=int,
              help="Training steps to check; then every rank stops cleanly. 0: run the script to its end.")
@click.option("--data-steps", default=500, show_default=True, type=int,
              help="After --steps, let the job run on up to this many steps with only the data recorder (indices, "
                   "no tensors) until every shuffling loader began its second epoch, so a missing set_epoch shows.")
@click.option("--equivalence", is_flag=True,
              help="For one step, compare DDP's averaged gradient with one process's gradient on all ranks' batches.")
@click.option("--verbose", "-v", is_flag=True, help="Every finding's full evidence.")
@json_option
@fail_on_option
@cli_errors
def command(steps: int, data_steps: int, equivalence: bool, verbose: bool, as_json: bool, fail_on: str, **kwargs: Any) -> None:
    watcher = pop_watcher(kwargs)
    spec = pop_launch_spec("check-sync", kwargs, as_json=as_json,
                           options={"steps": steps, "equivalence": equivalence, "data_steps": data_steps})
    report, job_exit = run_check_sync(spec, progress.with_progress(watcher, spec.torchrun, as_json),
                                      not_reporting=finish_quietly)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on,
         exit_code=job_exit or None)

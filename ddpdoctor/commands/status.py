"""`ddpdoctor status RUN`: the live state of a job under `ddpdoctor run` (steps/s, step time per rank, slowest
ranks, phase, alerts), read from its run directory; --watch refreshes it in place until the job ends."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors
from ddpdoctor.live.status import status_text
from ddpdoctor.reports.status import LiveStatus, assemble
from ddpdoctor.safe_io import dumps_json

EXAMPLES = ("\b\nExamples:\n  ddpdoctor status ddpdoctor-runs/job42\n"
            "  ddpdoctor status /shared/runs/job42 --watch\n  ddpdoctor status ddpdoctor-runs/job42 --json")


@click.command(help=__doc__, epilog=EXAMPLES)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place until the job ends (Ctrl-C to stop watching).")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes (--watch).")
@click.option("--fail-on", type=click.Choice(["error", "warning", "none"]), default="error", show_default=True,
              help="Exit 1 when the job failed (error) or, with warning, when a live alert was raised.")
@cli_errors
def command(run_dir: Path, as_json: bool, watch: bool, interval: float, fail_on: str) -> None:
    if not interval > 0:
        from ddpdoctor.errors import BadInput

        raise BadInput(f"--interval must be a positive number of seconds, not {interval}")
    tty = sys.stdout.isatty()
    while True:
        status = assemble(run_dir)
        st = status.to_json()
        if as_json:
            click.echo(dumps_json(st))
        else:
            text = status_text(st)
            # In place on a terminal (cursor home, clear below); a pipe gets one snapshot after another.
            click.echo(("\x1b[H\x1b[J" if watch and tty else "") + text, nl=False)
        if not watch or status.state == "finished":
            sys.exit(status.exit_code_for(fail_on))
        time.sleep(interval)


def exit_code(st: Mapping[str, object], fail_on: str) -> int:
    """1 for a finished job that failed (an error), or any live alert (warnings) with --fail-on warning."""
    return LiveStatus.from_json(st).exit_code_for(fail_on)

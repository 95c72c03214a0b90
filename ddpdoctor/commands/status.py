"""`ddpdoctor status RUN`: the live state of a job under `ddpdoctor run` (steps/s, step time per rank, slowest
ranks, phase, alerts), read from its run directory; --watch refreshes it in place until the job ends."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors
from ddpdoctor.live.status import load_status, status_text


@click.command(help=__doc__)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.option("--watch", is_flag=True, help="Refresh in place until the job ends (Ctrl-C to stop watching).")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between refreshes (--watch).")
@cli_errors
def command(run_dir: Path, as_json: bool, watch: bool, interval: float) -> None:
    if not interval > 0:
        from ddpdoctor.errors import BadInput

        raise BadInput(f"--interval must be a positive number of seconds, not {interval}")
    tty = sys.stdout.isatty()
    while True:
        st = load_status(run_dir)
        if as_json:
            click.echo(json.dumps(st, default=str))
        else:
            text = status_text(st)
            # In place on a terminal (cursor home, clear below); a pipe gets one snapshot after another.
            click.echo(("\x1b[H\x1b[J" if watch and tty else "") + text, nl=False)
        if not watch or st["state"] == "finished":
            return
        time.sleep(interval)

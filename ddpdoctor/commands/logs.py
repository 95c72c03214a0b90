"""`ddpdoctor logs FILE...`: explain the logs of a job that ran without ddpdoctor (hangs, crashes, mismatches).

FILE may be a torchrun/SLURM log, per-rank files (rank3.err, torchrun --log-dir), a directory of them, Flight
Recorder dumps (pickle or JSON), gzipped logs, or - for stdin."""

from __future__ import annotations

import click

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option


@click.command(help=__doc__, epilog=examples(
    "ddpdoctor logs slurm-12345.out",
    "ddpdoctor logs torchrun-logs/ fr_dumps/",
    "kubectl logs job/train | ddpdoctor logs -",
))
@click.argument("files", nargs=-1, required=True)
@click.option("--verbose", "-v", is_flag=True, help="Full evidence and the count of each kind of event parsed.")
@json_option
@fail_on_option
@cli_errors
def command(files: tuple[str, ...], verbose: bool, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.reports.logs import assemble

    report = assemble(files)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on)

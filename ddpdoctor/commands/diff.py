"""`ddpdoctor diff`: why is this run slower than that one? The step-time change, where in the step it happened, on
which rank, in which collective or bucket, whether it is more than noise, and what else changed (docs/diff.md)."""

from __future__ import annotations

from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option
from ddpdoctor.errors import BadInput


@click.command(help=__doc__ + "\n\nBASE, NEW: each a run directory of `ddpdoctor profile`, a folder of profiler traces, "
               "or one trace file (anything `analyze` takes). Both runs must have the same world size.",
               epilog=examples(
                   "ddpdoctor diff ddpdoctor-runs/yesterday ddpdoctor-runs/today",
                   "ddpdoctor diff base_traces/ new_traces/ --json > diff.json",
                   "ddpdoctor diff ddpdoctor-runs/main ddpdoctor-runs/pr-123 --fail-on warning   # a CI gate",
               ))
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Write the HTML diff (side-by-side step composition) here.")
@click.option("--verbose", "-v", is_flag=True, help="Every part, rank, collective class and bucket.")
@json_option
@fail_on_option
@cli_errors
def command(base: Path, new: Path, html_path: Path | None, verbose: bool, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.reports.diff import assemble

    report = assemble(base, new)
    if html_path is not None:
        from ddpdoctor.renderers.diff_html import write_diff_html

        try:
            write_diff_html(report, html_path)
        except OSError as exc:
            raise BadInput(f"cannot write the HTML diff ({exc.strerror or exc})", html_path) from exc
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on)

"""`ddpdoctor analyze`: compute/communication overlap, collectives, buckets and stragglers from profiler traces."""

from __future__ import annotations

from pathlib import Path

import click

from ddpdoctor.commands._common import cli_errors, emit, fail_on_option, json_option


def _renderer():  # noqa: ANN202 - the views helper's section renderer when present, else the generic one
    try:
        from ddpdoctor.renderers.console_perf import render_perf_sections
    except ImportError:
        return None
    return render_perf_sections


@click.command(help=__doc__ + "\n\nPATH: a run directory from `ddpdoctor profile`, a folder of traces, or trace files "
               "(.json / .json.gz, GPU or CPU, one rank or many).")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--window", type=click.Choice(["all", "hta"]), default="all", show_default=True,
              help="all: every recorded step. hta: only work launched before the last ProfilerStep begins "
              "(Holistic Trace Analysis's default, for comparing numbers).")
@click.option("--reread", is_flag=True, help="Re-read the traces instead of the per-rank summaries of a run directory.")
@click.option("--workers", type=click.IntRange(1, 1024), default=None, help="Processes reading traces (default: cores).")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
@json_option
@fail_on_option
@cli_errors
def command(paths: tuple[Path, ...], window: str, reread: bool, workers: int | None, verbose: bool, as_json: bool,
            fail_on: str) -> None:
    from ddpdoctor.analyses.pipeline import AnalyzeOptions, analyze_paths, report_for

    analysis = analyze_paths(list(paths), AnalyzeOptions(window=window, reread=reread, workers=workers))
    emit(report_for(analysis), as_json=as_json, verbose=verbose, fail_on=fail_on, sections=_renderer())

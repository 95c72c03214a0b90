"""`ddpdoctor analyze`: compute/communication overlap, collectives, buckets and stragglers from profiler traces."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option

if TYPE_CHECKING:
    from ddpdoctor.findings.model import Finding


@click.command(help=__doc__ + "\n\nPATH: a run directory from `ddpdoctor profile`, a folder of traces, or trace files "
               "(.json / .json.gz, GPU or CPU, one rank or many).\n\nA run directory is only read, never written to (an archived or "
               "read-only run stays analysable); --html and --merge write where you ask.",
               epilog=examples(
                   "ddpdoctor analyze ddpdoctor-runs/baseline",
                   "ddpdoctor analyze traces/*.pt.trace.json.gz --json > report.json",
                   "ddpdoctor analyze ddpdoctor-runs/baseline --merge merged.json.gz --html report.html",
               ))
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--window", type=click.Choice(["all", "hta"]), default="all", show_default=True,
              help="all: every recorded step. hta: only work launched before the last ProfilerStep begins "
              "(Holistic Trace Analysis's default, for comparing numbers).")
@click.option("--reread", is_flag=True, help="Re-read the traces instead of the per-rank summaries of a run directory.")
@click.option("--workers", type=click.IntRange(1, 1024), default=None, help="Processes reading traces (default: cores).")
@click.option("--verbose", "-v", is_flag=True, help="Per-step and per-collective tables.")
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None, help="Write the HTML report here.")
@click.option("--merge", "merge_path", type=click.Path(path_type=Path), default=None,
              help="Write one Perfetto/Chrome trace of all ranks, clocks aligned (e.g. merged.json.gz).")
@click.option("--max-input-mb", type=click.FloatRange(1), default=None,
              help="Largest (decompressed) input file to read, in MiB [default: 4096, or DDPDOCTOR_MAX_INPUT_MB].")
@json_option
@fail_on_option
@cli_errors
def command(paths: tuple[Path, ...], window: str, reread: bool, workers: int | None, verbose: bool,
            html_path: Path | None, merge_path: Path | None, max_input_mb: float | None, as_json: bool,
            fail_on: str) -> None:
    from ddpdoctor.traces import split

    if max_input_mb is not None:
        os.environ["DDPDOCTOR_MAX_INPUT_MB"] = str(max_input_mb)  # the trace-reading worker processes inherit it
    # A big GPU trace named here is being read on every core while the analyses (numpy...) are imported.
    with split.prefetch(list(paths), workers or split.usable_cores()):
        _analyze(paths, window, reread, workers, verbose, html_path, merge_path, as_json, fail_on)


def _analyze(paths: tuple[Path, ...], window: str, reread: bool, workers: int | None, verbose: bool,
             html_path: Path | None, merge_path: Path | None, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.analyses.pipeline import AnalyzeOptions, analyze_paths
    from ddpdoctor.renderers import progress
    from ddpdoctor.renderers.merge import trace_paths
    from ddpdoctor.renderers.outputs import write_outputs
    from ddpdoctor.reports.analyze import assemble
    from ddpdoctor.traces.loader import no_gc

    show = progress.enabled(as_json)
    # No cyclic garbage collection while the report is built and printed: what this builds (columns, summaries,
    # the report's sections) holds no cycles, and the collector's passes over it freed nothing and cost ~3% of
    # analysing a 110 MB trace. Restored on the way out (the command may run inside a caller's process).
    with no_gc():
        with progress.bar("analysing", None, show, unit="MB") as advance:
            analysis = analyze_paths(list(paths), AnalyzeOptions(window=window, reread=reread, workers=workers,
                                                                 on_bytes=advance))
        report = assemble(analysis)
        del analysis  # what the report did not take (a long trace's columns) is free for the output's encoding
        report.findings.extend(_unfinished(paths))
        # A run directory is read, never rewritten: `profile` already wrote its report.html and scalars, and an
        # archived or read-only run must stay analysable. --html/--merge write where the user asks.
        write_outputs(report, None, html_path, merge_path, trace_paths(list(paths)) if merge_path else [],
                      show_progress=show)
        emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on)


def _unfinished(paths: tuple[Path, ...]) -> list[Finding]:
    """run-unfinished for a run directory whose ddpdoctor was killed (SIGKILL, a crash) before it finished: its
    manifest still says running and no live ddpdoctor holds its lock. Without it, a killed run read "ok". And
    disk-full for a run whose disk filled during the job: what the run directory lacks."""
    from ddpdoctor.findings.job import disk_full_findings, ended_findings
    from ddpdoctor.launch import runlock
    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.loaders import rank_statuses

    found = []
    for path in paths:
        run = RunDir(Path(path))
        if not run.is_run_dir():
            continue
        manifest = manifest_mod.load_typed(run)
        findings, _stopped = ended_findings(manifest, runlock.is_locked(run.root))
        found += [f for f in findings if f.id == "run-unfinished"]
        if manifest.disk_full:  # the ranks' statuses matter only then (and a damaged one must not stop analyze)
            found += disk_full_findings(manifest, rank_statuses(run))
    return found

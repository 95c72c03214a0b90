"""`ddpdoctor topo`: read NCCL_DEBUG=INFO output and topology dumps, and flag a misconfigured fabric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option
from ddpdoctor.report import Report


def render_sections(report: Report, out: Any, verbose: bool) -> None:
    """Moved to ddpdoctor/renderers/console_topo.py; kept for callers that have not moved yet."""
    from ddpdoctor.renderers.console_topo import render_sections as render

    render(report, out, verbose)


def build_report(logs: list[Path], xmls: list[Path]) -> Report:
    """Moved to ddpdoctor/reports/topo.py (``assemble``); kept for callers that have not moved yet."""
    from ddpdoctor.reports.topo import assemble

    return assemble(logs, xmls)


@click.command(help=__doc__ + "\n\nFILES: NCCL logs (SLURM/torchrun output), topology XML, or a ddpdoctor run directory.",
               epilog=examples(
                   "NCCL_DEBUG=INFO srun python train.py > nccl.log 2>&1; ddpdoctor topo nccl.log",
                   "ddpdoctor topo nccl.log --topo-xml topo.xml",
                   "ddpdoctor topo ddpdoctor-runs/baseline",
               ))
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--topo-xml", "xmls", multiple=True, type=click.Path(path_type=Path),
              help="NCCL_TOPO_DUMP_FILE / NCCL_TOPO_FILE XML (repeatable); XML given as FILES is detected too.")
@click.option("--verbose", "-v", is_flag=True, help="Every host, every GPU of the topology, full evidence.")
@json_option
@fail_on_option
@cli_errors
def command(files: tuple[Path, ...], xmls: tuple[Path, ...], verbose: bool, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.reports.topo import assemble

    report = assemble(list(files), list(xmls))
    for problem in report.notes:
        click.echo(f"ddpdoctor: warning: {problem}", err=True)
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on)

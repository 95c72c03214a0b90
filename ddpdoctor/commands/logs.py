"""`ddpdoctor logs FILE...`: explain the logs of a job that ran without ddpdoctor (hangs, crashes, mismatches).

FILE may be a torchrun/SLURM log, per-rank files (rank3.err, torchrun --log-dir), a directory of them, Flight
Recorder dumps (pickle or JSON), gzipped logs, or - for stdin."""

from __future__ import annotations

from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option
from ddpdoctor.report import Report


def _sections(report: Report, out: Any, verbose: bool) -> None:
    table = Table(title="Inputs", show_lines=False, expand=False)
    for col in ("input", "kind", "lines", "ranks", "events"):
        table.add_column(col)
    for s in report.sections.get("inputs", []):
        ranks = ",".join(str(r) for r in s["ranks"][:12]) + ("…" if len(s["ranks"]) > 12 else "")
        table.add_row(escape(s["name"]), s["kind"] if not s["problem"] else f"[yellow]{escape(s['problem'])}[/]",
                      str(s["lines"]), ranks, str(s["events"]))
    out.print(table)
    timeline = report.sections.get("timeline") or []
    if verbose and timeline:
        out.print("Failure lines, merged on their timestamps (first 20):")
        for t in timeline[:20]:
            who = f"rank {t['rank']}" if t["rank"] is not None else (t["host"] or "?")
            out.print(f"  {escape(t['where'])} [{escape(who)}] {escape(t['kind'])}: {escape(t['text'][:160])}")
    if verbose and report.sections.get("events"):
        out.print("events: " + escape(", ".join(f"{k}={v}" for k, v in sorted(report.sections["events"].items()))))


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
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=_sections)

"""Terminal view of the check-sync sections (what was compared, the data shards per epoch) and of the run
directory line that launch reports end with."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from ddpdoctor.report import Report


def render_sync_sections(report: Report, out: Any, verbose: bool) -> None:
    """The "checks" section: what was compared, and the data shards per epoch."""
    from ddpdoctor.reports.sections import SyncChecksSection, section_of

    section = section_of(report, SyncChecksSection)
    checks = section.checks if section is not None else None
    if not checks:
        print_run_dir(report, out)
        return
    line = f"checked {checks['steps_checked']} step(s) on ranks {checks['ranks']}"
    if checks.get("steps_run", 0) > checks["steps_checked"]:
        line += f"; the data recorder ran on to step {checks['steps_run']}"
    out.print(line)
    table = Table(title="Cross-rank comparisons")
    for col in ("what", "steps", "comparisons", "differ", "within tolerance"):
        table.add_column(col)
    for key, c in (("grads", checks["grads"]), ("params", checks["params"]), ("buffers", checks["buffers"])):
        table.add_row(key, str(len(c["steps"])), str(c["comparisons"]), str(c["diverged"]), str(c["within_tolerance"]))
    opt = checks.get("optimizer_steps")
    if opt:  # every optimizer's step count, equal on every rank
        table.add_row("optimizer steps", str(len(opt["steps"])), str(opt["comparisons"]), str(opt["diverged"]), "-")
    layouts = checks.get("layouts")
    if layouts:  # DTensor parameters: sharded ones are compared by layout only
        table.add_row("layouts", "-", str(layouts["comparisons"]), str(layouts["differ"]), "-")
    out.print(table)
    if checks["data"]:
        data = Table(title="Data shards (training loaders)")
        for col in ("loader", "epoch", "samples per rank", "batches per rank", "shared", "unseen"):
            data.add_column(col)
        for e in checks["data"][: None if verbose else 6]:
            data.add_row(str(e["loader"]), str(e["epoch"]), str(e["samples_per_rank"]), str(e["batches_per_rank"]),
                         str(e["shared"]), "-" if e["missing"] is None else str(e["missing"]))
        out.print(data)
    print_run_dir(report, out)


def print_run_dir(report: Report, out: Any) -> None:
    from ddpdoctor.reports.sections import RunDirSection, section_of

    where = section_of(report, RunDirSection)
    if where and where.run_dir:
        out.print(f"[dim]run directory: {escape(str(where.run_dir))}[/dim]")

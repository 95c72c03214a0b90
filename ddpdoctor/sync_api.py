"""`ddpdoctor.check_sync(...)` for test suites, and the report that `check-sync` builds from a run directory."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ddpdoctor.errors import BadInput
from ddpdoctor.report import Report
from ddpdoctor.rundir.layout import RunDir


def sync_report(run: RunDir, report: Report | None = None) -> Report:
    """The check-sync analysis of ``run`` (ddpdoctor/reports/check_sync.py), added to ``report`` (a new one by
    default)."""
    from ddpdoctor.reports.check_sync import sync_parts

    report = report or Report(command="check-sync")
    section, findings, notes = sync_parts(run)
    report.notes.extend(notes)
    report.findings.extend(findings)
    if section is not None:
        report.add(section)
    return report


def run_check_sync(spec: Any, watcher: Any = None,
                   not_reporting: Callable[[Any], None] | None = None) -> tuple[Report, int]:
    """Launch ``spec`` (mode "check-sync"), check, analyse: (report, the job's exit code). The report is also
    saved as RUN/report.json. ``not_reporting`` is called with the launch's result when this process does not
    report (another node's launcher, or a rank under --launcher none: the command exits there)."""
    from ddpdoctor.launch.launcher import launch
    from ddpdoctor.launch.monitor import make_watcher
    from ddpdoctor.reports.check_sync import assemble
    from ddpdoctor.rundir.report import save_report_or_problem
    from ddpdoctor.terminal_text import one_line

    steps = spec.options.get("steps", 5)
    if steps < 0:
        raise BadInput(f"--steps must be >= 0, not {steps}")
    # Watched like every launch: a check-sync run that hangs is reported with its culprit, not left hanging.
    result = launch(spec, watcher if watcher is not None else make_watcher(None, 600.0, "kill"))
    if not result.reports and not_reporting is not None:
        not_reporting(result)
    from ddpdoctor.launch.runlock import is_locked

    report = assemble(spec.run_dir, result.exit_code, locked=is_locked(spec.run_dir.root))
    problem = save_report_or_problem(spec.run_dir, report)
    if problem:  # a full disk: the report is returned (and printed) all the same
        sys.stderr.write(f"ddpdoctor: warning: {one_line(problem)}; the report is complete below\n")
    return report, result.exit_code


def check_sync(script: str, *script_args: str, nproc_per_node: int = 2, steps: int = 5, equivalence: bool = False,
               data_steps: int = 500,
               out: str | Path | None = None, torchrun: Mapping[str, str | int | bool] | None = None, quiet: bool = True) -> Report:
    """Run SCRIPT under `ddpdoctor check-sync` and return its Report (``.status``, ``.findings``, ``.to_json()``).

    For test suites::

        report = ddpdoctor.check_sync("train.py", "--epochs", "1", nproc_per_node=2)
        assert report.status == "ok", report.findings

    ``report.sections["job"]["exit_code"]`` is the script's own exit code. Raises BadInput for a bad script path."""
    from ddpdoctor.launch.launcher import LaunchSpec

    flags = {"--nproc-per-node": str(nproc_per_node), **(torchrun or {})}
    run_dir = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="ddpdoctor-check-sync-"))
    spec = LaunchSpec(mode="check-sync", script=script, script_args=list(script_args), run_dir=RunDir(run_dir),
                      torchrun=flags, options={"steps": steps, "equivalence": equivalence, "data_steps": data_steps}, quiet=quiet)
    report, _ = run_check_sync(spec)
    return report

"""`preflight`'s report: the checks table (one row per check, with its evidence), the bandwidth table, and a
finding per failed or warning check."""

from __future__ import annotations

from ddpdoctor.preflight.checks import CheckResult
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import PreflightSection
from ddpdoctor.rundir.layout import RunDir


def assemble(checks: list[CheckResult], run: RunDir, duration_s: float, killed_by: str | None) -> Report:
    from ddpdoctor.preflight.merge import bandwidth_rows
    from ddpdoctor.preflight.nccltable import format_table

    bandwidth = next((c for c in checks if c.id == "allreduce_bandwidth"), None)
    rows = bandwidth_rows(bandwidth.evidence) if bandwidth is not None else []
    table = format_table(rows, f"all_reduce, {bandwidth.evidence.get('world_size')} ranks, "
                               "time = slowest rank's mean") if rows and bandwidth else None
    section = PreflightSection.from_json({"checks": [c.to_json() for c in checks], "bandwidth_table": table,
                                          "run_dir": str(run.root), "duration_s": round(duration_s, 2)})
    return Report("preflight", parts=[section], findings=[f for c in checks if (f := c.finding())],
                  notes=[f"the job was killed: {killed_by}"] if killed_by else [])


"""`capture`'s report: a window folder of a running job, analysed like `profile` (--profile) or like
`check-sync` (--check-sync)."""

from __future__ import annotations

from ddpdoctor.report import Report
from ddpdoctor.reports.sections import RunDirSection
from ddpdoctor.rundir.layout import RunDir


def assemble_profile(window: RunDir, misaligned: str | None) -> Report:
    """`capture --profile N`: the window's traces analysed; ``misaligned`` notes ranks that recorded other steps."""
    from ddpdoctor.reports.analyze import assemble_run_dir

    perf = assemble_run_dir(window, "capture")
    return Report("capture", parts=[*perf.parts, RunDirSection(str(window.root))], findings=perf.findings,
                  notes=[*perf.notes, *([misaligned] if misaligned else [])])


def assemble_check_sync(window: RunDir, misaligned: str | None) -> Report:
    """`capture --check-sync N`: the window's fingerprints compared across ranks."""
    from ddpdoctor.reports.check_sync import assemble_capture

    return assemble_capture(window, misaligned)

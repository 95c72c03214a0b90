"""`analyze`'s report: the performance analysis of traces as a PerfSection, the bucket what-if, the findings."""

from __future__ import annotations

from ddpdoctor.analyses.results import Analysis
from ddpdoctor.errors import BadInput
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import PerfSection
from ddpdoctor.rundir.layout import RunDir


def perf_section(analysis: Analysis) -> tuple[PerfSection, list, list[str]]:  # type: ignore[type-arg]
    """The analysis's section, its performance findings and its notes (with what every verdict rests on)."""
    from ddpdoctor.findings.parallelism import analysis_parallelism
    from ddpdoctor.findings.perf import perf_report_parts

    extra, findings = perf_report_parts(analysis)
    findings = [*findings, *analysis_parallelism(analysis.parallelism)]  # what the run built (FSDP2, HSDP, TP)
    steps = max((len(r.per_step) for r in analysis.ranks), default=0)
    notes = list(analysis.notes)
    if steps:
        # What every verdict rests on: a reader weighs "warning" from 3 steps differently from 30.
        notes.append(f"verdicts rest on {steps} recorded step(s) per rank, {len(analysis.ranks)} rank(s); "
                     "figures carry 90% intervals over them (docs/findings.md)")
    # The same path as a saved report's: the analysis's JSON (docs/json.md), loaded as the typed section.
    return PerfSection.from_json({**analysis.to_sections(), **extra}), list(findings), notes


def assemble(analysis: Analysis, command: str = "analyze") -> Report:
    """The Report of an analysis (``ddpdoctor analyze``; `profile` and `capture` start from it)."""
    section, findings, notes = perf_section(analysis)
    return Report(command, parts=[section], findings=findings, notes=notes)


def assemble_run_dir(run: RunDir, command: str = "analyze") -> Report:
    """A run directory's traces, after its ranks exited: unusable traces (a rank killed while writing) leave a
    note, since the job's own findings still matter more than exit code 2."""
    from ddpdoctor.analyses.pipeline import analyze_paths

    try:
        return assemble(analyze_paths([run.root]), command)
    except BadInput as exc:
        return Report(command, notes=[f"traces not analysed: {exc}"])

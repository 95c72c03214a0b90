"""`topo`'s report: NCCL logs, topology XML or a run directory read into the fabric sections and their findings;
and the "topology" section a launch adds with `--nccl-debug`."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.logs.sanitize import clean_report
from ddpdoctor.report import Report, split_sections
from ddpdoctor.reports.sections import COMMAND_SECTIONS, TopologySection
from ddpdoctor.rundir.layout import RunDir


def assemble(logs: list[Path], xmls: list[Path]) -> Report:
    """Everything `topo` prints, as a Report (escape sequences cleaned); BadInput when no file given was usable."""
    from ddpdoctor.topo.capture import analyze_run_dir, is_run_dir, run_backend
    from ddpdoctor.topo.diagnose import diagnose, read_inputs

    run_dirs = [p for p in logs if p.is_dir() and is_run_dir(p)]
    files: list[Path] = []
    for p in logs:
        if p in run_dirs:
            continue
        if p.is_dir():  # a folder of logs (e.g. one SLURM output per node): its visible files, not recursive
            inside = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
            files += inside or [p]
        else:
            files.append(p)
    if run_dirs and not files and not xmls and len(run_dirs) == 1:
        section, findings = analyze_run_dir(run_dirs[0], run_backend(run_dirs[0]))
        return _typed(clean_report(Report("topo", sections={"run_dir": str(run_dirs[0]), **section},
                                          findings=findings)))
    for d in run_dirs:
        files += sorted((d / "ranks").glob("rank*/std*.log")) + sorted((d / "ranks").glob("rank*/nccl_topo.xml"))
    inputs = read_inputs(files, xmls)
    if not inputs.used:
        if not inputs.problems:
            raise BadInput("give at least one NCCL log or topology XML file")
        extra = f" (and {len(inputs.problems) - 1} more unusable file(s))" if len(inputs.problems) > 1 else ""
        raise BadInput(inputs.problems[0] + extra)
    sections, findings = diagnose(inputs.log, inputs.systems, inputs.extra)
    notes = [f"skipped {p}" for p in inputs.problems]
    return _typed(clean_report(Report("topo", sections=sections, findings=findings, notes=notes)))


def _typed(report: Report) -> Report:
    return Report(report.command, parts=split_sections(report.sections, COMMAND_SECTIONS["topo"]),
                  findings=report.findings, notes=report.notes)


def add_run_topology(report: Report, run: RunDir) -> Report:
    """``report`` with a launch's "topology" section and its fabric findings (`--nccl-debug`)."""
    from ddpdoctor.topo.capture import analyze_run_dir, run_backend

    section, findings = analyze_run_dir(run.root, run_backend(run.root))
    return Report(report.command, parts=[*report.parts, TopologySection(section)],
                  findings=[*report.findings, *findings], notes=report.notes, stopped=report.stopped)

"""`diff`'s report: each side analysed through analyze's own entry point, the pure diff of the two
(analyses/diff.py), the operators on the ranks where the step changed, what else changed, and the rules
(findings/diff.py); and the same added to a `profile --baseline` report (docs/diff.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from ddpdoctor.analyses.results import Analysis
from ddpdoctor.errors import BadInput
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import DiffSection, TopologySection
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.schema import Manifest
from ddpdoctor.topo.section_types import TopoSummary


def _topology(run: RunDir) -> TopoSummary | None:
    """The NCCL topology summary a `profile --nccl-debug` run's report.json holds (docs/topo.md), or None."""
    from ddpdoctor.safe_io import loads_json, read_bytes

    path = run.root / "report.json"
    if not path.is_file():
        return None
    try:
        data = loads_json(read_bytes(path, 64 << 20, decompress=False))
    except (BadInput, ValueError):
        return None  # the report is a hint here; the traces are what is compared
    summary = (data.get("topology") or {}).get("summary") if isinstance(data, dict) else None
    return _as_summary(summary)


def _as_summary(raw: object) -> TopoSummary | None:
    """Raw JSON in (a saved report, or the topology section being assembled): taken as the summary it should be;
    analyses/diff_changes.facts reads each fact defensively, so a damaged one costs a fact, not the diff."""
    return cast(TopoSummary, raw) if isinstance(raw, dict) else None


def _side(path: Path, which: str, topology: TopoSummary | None = None) -> tuple[Analysis, Manifest | None, TopoSummary | None]:
    """(Analysis, Manifest or None, topology summary or None) of one side, through analyze's own entry point; a run
    that failed is bad input. ``topology``: the side's summary when its report is still being assembled."""
    from ddpdoctor.analyses.pipeline import analyze_paths
    from ddpdoctor.rundir import artefacts
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.schema import Manifest

    manifest = None
    run = RunDir(path)
    if path.is_dir() and run.is_run_dir():
        manifest = artefacts.load(run.manifest, Manifest)
        how = manifest.ended.how if manifest.ended else None
        if manifest.exit_code not in (0, None) or how not in (None, "exited") or not manifest.finished:
            what = f"exit code {manifest.exit_code}" if manifest.exit_code not in (0, None) else \
                "it has not finished: still running, or ddpdoctor was killed" if how == "running" or \
                not manifest.finished else f"it ended by {how}"
            raise BadInput(f"the {which} run failed ({what}): its steps are not comparable; diff two runs that "
                           "completed", path)
        topology = topology if topology is not None else _topology(run)
    return analyze_paths([path]), manifest, topology


# Ranks whose traces are re-read for operator times: the contributors' and the lowest (bounded at any world size).
OPS_RANKS = 4


def _operators(base: Any, new: Any, d: Any) -> tuple[list[Any], str | None]:
    """Operators whose time changed, on the ranks where the step's parts did: their traces read with the one loader."""
    from ddpdoctor.analyses.diff_ops import op_deltas, op_steps
    from ddpdoctor.traces.loader import load_raw

    ranks = list(dict.fromkeys([c.rank for c in d.contributors] + [min(r.rank for r in base.ranks)]))[:OPS_RANKS]

    def side(a: Any) -> list[Any]:
        out = []
        for inp in a.inputs:
            if inp.rank not in ranks:
                continue
            files = [Path(p) for p in inp.path.split(",") if p.endswith((".json", ".json.gz"))
                     and not p.endswith("summary.json")]
            for f in files:
                out.append(op_steps(load_raw(f), inp.rank))
        return out

    try:
        b, n = side(base), side(new)
    except BadInput as exc:
        return [], f"operators not compared: {exc}"
    if not b or not n:
        return [], "operators not compared: no trace files on one side"
    return op_deltas(b, n, d.step.base_us, d.min_effect_us), None


def assemble(base_path: Path, new_path: Path, command: str = "diff",
             new_topology: TopoSummary | None = None) -> Report:
    """The diff of two runs as a Report: the "diff" section and its findings."""
    from ddpdoctor.analyses.diff import diff
    from ddpdoctor.analyses.diff_changes import config_changes, facts
    from ddpdoctor.findings.diff import diff_findings

    base, bman, btopo = _side(base_path, "base")
    new, nman, ntopo = _side(new_path, "new", new_topology)
    bw, nw = len(base.ranks), len(new.ranks)
    if bw != nw:
        raise BadInput(f"the runs have different world sizes (base {bw} rank(s), new {nw}): per-rank and per-bucket "
                       "figures do not compare; diff runs of the same world size", new_path)
    if not any(r.per_step for r in base.ranks) or not any(r.per_step for r in new.ranks):
        raise BadInput("a run has no recorded steps to compare", base_path if not base.ranks else new_path)
    d = diff(base, new, config_changes(facts(bman, btopo), facts(nman, ntopo)), labels=(str(base_path), str(new_path)))
    if d.contributors:
        d.operators, note = _operators(base, new, d)
        if note:
            d.notes.append(note)
    notes = list(d.notes)
    if bman is None or nman is None:
        notes.append("traces without a run directory record no environment or configuration: "
                     "'what else changed' covers only what both runs recorded")
    return Report(command, parts=[DiffSection.from_json({"diff": d.to_json()})], findings=diff_findings(d), notes=notes)


def add_baseline(report: Report, baseline: Path, run_root: Path) -> Report:
    """``report`` (a profile's) with its diff against ``baseline``: the "diff" section and its findings. When the two
    cannot be compared (a failed run, another world size) a note says why: the job's own report still stands."""
    topo = report.section(TopologySection)
    summary = (topo.topology.get("summary") if topo is not None else None) or None
    try:
        d = assemble(baseline, run_root, command=report.command,
                     new_topology=_as_summary(summary))
    except BadInput as exc:
        return Report(report.command, parts=report.parts, findings=report.findings,
                      notes=[*report.notes, f"not compared with the baseline: {exc}"], stopped=report.stopped)
    return Report(report.command, parts=[*report.parts, *d.parts], findings=[*report.findings, *d.findings],
                  notes=[*report.notes, *(f"baseline: {n}" for n in d.notes)], stopped=report.stopped)

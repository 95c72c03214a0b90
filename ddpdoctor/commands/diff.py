"""`ddpdoctor diff`: why is this run slower than that one? The step-time change, where in the step it happened, on
which rank, in which collective or bucket, whether it is more than noise, and what else changed (docs/diff.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddpdoctor.commands._common import cli_errors, emit, examples, fail_on_option, json_option
from ddpdoctor.errors import BadInput
from ddpdoctor.report import Report


@click.command(help=__doc__ + "\n\nBASE, NEW: each a run directory of `ddpdoctor profile`, a folder of profiler traces, "
               "or one trace file (anything `analyze` takes). Both runs must have the same world size.",
               epilog=examples(
                   "ddpdoctor diff ddpdoctor-runs/yesterday ddpdoctor-runs/today",
                   "ddpdoctor diff base_traces/ new_traces/ --json > diff.json",
                   "ddpdoctor diff ddpdoctor-runs/main ddpdoctor-runs/pr-123 --fail-on warning   # a CI gate",
               ))
@click.argument("base", type=click.Path(path_type=Path))
@click.argument("new", type=click.Path(path_type=Path))
@click.option("--html", "html_path", type=click.Path(path_type=Path), default=None,
              help="Write the HTML diff (side-by-side step composition) here.")
@click.option("--verbose", "-v", is_flag=True, help="Every part, rank, collective class and bucket.")
@json_option
@fail_on_option
@cli_errors
def command(base: Path, new: Path, html_path: Path | None, verbose: bool, as_json: bool, fail_on: str) -> None:
    from ddpdoctor.renderers.diff_console import render_diff_section

    report = diff_report(base, new)
    if html_path is not None:
        from ddpdoctor.renderers.diff_html import write_diff_html

        try:
            write_diff_html(report, html_path)
        except OSError as exc:
            raise BadInput(f"cannot write the HTML diff ({exc.strerror or exc})", html_path) from exc
    emit(report, as_json=as_json, verbose=verbose, fail_on=fail_on, sections=render_diff_section)


def _topology(run: Any) -> dict[str, Any] | None:
    """The NCCL topology summary a `profile --nccl-debug` run's report.json holds (docs/topo.md), or None."""
    import json

    from ddpdoctor.safe_io import read_bytes

    path = run.root / "report.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(read_bytes(path, 64 << 20, decompress=False))
    except (BadInput, ValueError):
        return None  # the report is a hint here; the traces are what is compared
    summary = (data.get("topology") or {}).get("summary") if isinstance(data, dict) else None
    return summary if isinstance(summary, dict) else None


def _side(path: Path, which: str) -> tuple[Any, Any, dict[str, Any] | None]:
    """(Analysis, Manifest or None, topology summary or None) of one side, through analyze's own entry point; a run
    that failed is bad input."""
    from ddpdoctor.analyses.pipeline import analyze_paths
    from ddpdoctor.rundir import artefacts
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.schema import Manifest

    manifest, topology = None, None
    run = RunDir(path)
    if path.is_dir() and run.is_run_dir():
        manifest = artefacts.load(run.manifest, Manifest)
        ended = manifest.ended or {}
        how = ended.get("how")
        if manifest.exit_code not in (0, None) or how not in (None, "exited") or not manifest.finished:
            what = f"exit code {manifest.exit_code}" if manifest.exit_code not in (0, None) else \
                "it has not finished: still running, or ddpdoctor was killed" if how == "running" or \
                not manifest.finished else f"it ended by {how}"
            raise BadInput(f"the {which} run failed ({what}): its steps are not comparable; diff two runs that "
                           "completed", path)
        topology = _topology(run)
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


def diff_report(base_path: Path, new_path: Path, command: str = "diff") -> Report:
    """The diff of two runs as a Report: the "diff" section and its findings."""
    from ddpdoctor.analyses.diff import diff
    from ddpdoctor.analyses.diff_changes import config_changes, facts
    from ddpdoctor.findings.diff import diff_findings

    base, bman, btopo = _side(base_path, "base")
    new, nman, ntopo = _side(new_path, "new")
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
    return Report(command=command, sections={"diff": d.to_json()}, findings=diff_findings(d), notes=notes)

"""The run directories the fuzz suite damages, and what ddpdoctor does with each artefact (its consumers)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import SAMPLE_RUN

SEEDS = Path(__file__).parent / "seeds"


def _profile(run: Path) -> Any:
    from ddpdoctor.analyses.pipeline import analyze_paths
    from ddpdoctor.reports.analyze import assemble as report_for
    from ddpdoctor.reports.watched import watched_report
    from ddpdoctor.rundir.layout import RunDir

    report = report_for(analyze_paths([run]))
    json.dumps(report.to_json(), default=str)
    return watched_report(RunDir(run), "profile", locked=False, analyse_traces=False).to_json()


def _watched(run: Path) -> Any:
    from ddpdoctor.reports.watched import watched_report
    from ddpdoctor.rundir.layout import RunDir

    return watched_report(RunDir(run), "run", locked=False, debug=True).to_json()


def _sync(run: Path) -> Any:
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.sync_api import sync_report

    return sync_report(RunDir(run)).to_json()


def _preflight(run: Path) -> Any:
    from ddpdoctor.preflight.merge import MergeOptions, load_records, merge

    return [c.__dict__ for c in merge(load_records(run), MergeOptions())]


def _make_preflight(dest: Path) -> None:
    from tests.unit.test_preflight_merge import _rec

    records = {r: _rec(r) for r in range(2)}
    for r, rec in records.items():
        (dest / "ranks" / f"rank{r}").mkdir(parents=True, exist_ok=True)
        (dest / "ranks" / f"rank{r}" / "preflight.json").write_text(json.dumps(rec))
    (dest / "preflight.json").write_text(json.dumps({"ranks": {str(r): rec for r, rec in records.items()}}))


# kind -> (how to build the run directory, its consumer, the artefacts to damage)
RUNS: dict[str, tuple[Callable[[Path], None], Callable[[Path], Any], list[str]]] = {
    "profile": (lambda d: shutil.copytree(SAMPLE_RUN, d, dirs_exist_ok=True), _profile,
                ["manifest.json", "ranks/rank0/summary.json", "ranks/rank1/status.json", "ranks/rank0/info.json",
                 "heartbeats.json"]),
    "hang": (lambda d: shutil.copytree(SEEDS / "hang_run", d, dirs_exist_ok=True), _watched,
             ["hang.json", "heartbeats.json", "ranks/rank1/status.json", "ranks/rank0/info.json", "manifest.json"]),
    "sync": (lambda d: shutil.copytree(SEEDS / "sync_run", d, dirs_exist_ok=True), _sync,
             ["ranks/rank0/sync.json", "ranks/rank1/data.json", "ranks/rank0/sync-all.json"]),
    "preflight": (_make_preflight, _preflight, ["ranks/rank1/preflight.json", "preflight.json"]),
}

CASES = [(kind, name) for kind, (_, _, names) in RUNS.items() for name in names]


def build(kind: str, dest: Path) -> Path:
    RUNS[kind][0](dest)
    return dest


def consume(kind: str, run: Path) -> Any:
    return RUNS[kind][1](run)

"""SIGTERM to one rank at start-up, recorded while the other rank was still starting (tests/e2e/test_signal_startup.py
on a loaded machine): rank 1 killed itself 0.2 s after its probe started; torchrun then stopped rank 0 (SIGTERM)
before rank 0's probe had written anything, not even info.json. Rank 0 is torchrun's victim, known by its log
("Sending process PID closing signal SIGTERM") and its failure table (rank 0: SIGTERM, not the first observed
failure); rank 1 is the culprit. Before, rank 0's pid was looked up in its info.json only, so the report blamed
rank 0 ("ended without a status") and did not name rank 1 at all.

The fixture (tests/fixtures/startup_sigterm/) is that run of `ddpdoctor run --nproc-per-node 2 -q --json`, trimmed
(the lock, report.json, live/, torchrun's per-attempt copies, rank 1's ledger and stacks removed)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ddpdoctor.findings.model import Severity
from ddpdoctor.reports.watched import torn_down_ranks, watched_report
from ddpdoctor.rundir.layout import RunDir
from ddpdoctor.rundir.loaders import rank_statuses

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "startup_sigterm"


def _run(tmp_path: Path) -> RunDir:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE, dst)
    return RunDir(dst)


def test_rank_stopped_before_its_probe_started_is_torchruns_victim(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert not run.rank_file(0, "info.json").exists()  # what made its pid unknown
    assert torn_down_ranks(run, rank_statuses(run)) == {0}


def test_the_rank_that_killed_itself_is_the_culprit(tmp_path: Path) -> None:
    report = watched_report(_run(tmp_path), "run", locked=False)
    errors = [f for f in report.findings if f.severity is Severity.ERROR]
    assert [(f.id, f.ranks) for f in errors] == [("rank-crashed", [1])], report.findings
    assert "killed by SIGTERM" in errors[0].title and errors[0].evidence["victims"] == [0]
    assert report.exit_code() == 1


def test_a_silent_rank_torchrun_did_not_stop_is_still_no_status(tmp_path: Path) -> None:
    # Without torchrun's closing signal in the log, nothing says rank 0 was stopped: it stays unexplained.
    run = _run(tmp_path)
    log = run.root / "torchrun" / "torchrun.log"
    log.write_text("".join(ln for ln in log.read_text().splitlines(keepends=True) if "closing signal" not in ln))
    assert torn_down_ranks(run, rank_statuses(run)) == set()
    report = watched_report(run, "run", locked=False)
    assert "rank-no-status" in {f.id for f in report.findings}

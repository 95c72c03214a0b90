"""Verdicts over several recorded runs of one healthy script (tests/fixtures/verdicts): the same recording always
gives the same verdict (seeded intervals), no run is called an error, every run finds the tiny model's unhideable
communication and explains it (info, one bucket), never a bucket-size recommendation."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.reports.analyze import assemble as report_for

RUNS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "verdicts").glob("healthy_run*"))


def _verdict(run: Path) -> tuple[str, tuple[str, ...]]:
    report = report_for(analyze_paths([run]))
    return report.status, tuple(sorted(f.id for f in report.findings))


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_the_same_recording_gives_the_same_verdict(run):
    first = report_for(analyze_paths([run])).to_json()
    again = report_for(analyze_paths([run])).to_json()
    assert first["findings"] == again["findings"] and first["status"] == again["status"]


def test_recorded_runs_of_one_healthy_script_give_one_verdict():
    # Five runs: three on 2 cores shared by 8 concurrent jobs (step times vary with cv 0.5-0.9, and a rank often
    # leaves a collective last and so starts the next later), two on an idle machine with the default window.
    # The same status and the same set of findings in every one: noise of the host is not a finding.
    assert len(RUNS) >= 5
    verdicts = [_verdict(r) for r in RUNS]
    assert len(set(verdicts)) == 1, verdicts
    assert verdicts[0] == ("ok", ("exposed-comm-high",)), verdicts
    for run in RUNS:
        for f in report_for(analyze_paths([run])).findings:
            assert f.severity.value != "error"
            if "cost_ms_per_step" in f.evidence and f.evidence["cost_pct_of_step"] is not None:
                assert 0 <= f.evidence["cost_pct_of_step"] <= 100
    # The headline finding of this tiny model is found in every run, as the one-bucket explanation, and no run
    # recommends a bucket size for a model that fits in one bucket at any cap.
    assert all("exposed-comm-high" in ids and "bucket-cap-whatif" not in ids for _, ids in verdicts), verdicts
    for run in RUNS:
        f = next(f for f in report_for(analyze_paths([run])).findings if f.id == "exposed-comm-high")
        assert f.severity.value == "info" and f.evidence["single_bucket_bytes"] > 0
        assert "bucket_cap_mb=" not in f.advice

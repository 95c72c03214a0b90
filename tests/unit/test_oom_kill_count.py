"""A rank killed outright leaves no status: the host's OOM-kill count over the job (/proc/vmstat oom_kill at launch
and at the end, in the manifest) tells the OOM killer from another SIGKILL (crash-oom-2r; docs/accuracy.md miss 5)."""

from __future__ import annotations

import json
from pathlib import Path

from ddpdoctor.findings.crash import crash_findings
from ddpdoctor.reports.watched import _oom_kills
from ddpdoctor.rundir.layout import RunDir

STATUSES = {0: {"exception": "RuntimeError: [pair.cc:553] Connection closed by peer", "ended_at": 2.0}, 1: None}


def _said(oom_kills: int | None) -> str:
    (f,) = [f for f in crash_findings(STATUSES, oom_kills=oom_kills) if f.id == "rank-crashed"]
    assert f.evidence["rank"] == 1
    return str(f.evidence["exception"])


def test_the_oom_killer_firing_during_the_job_is_said() -> None:
    assert "SIGKILL" in _said(1) and "OOM killer fired 1 time(s) meanwhile" in _said(1)


def test_no_oom_kill_during_the_job_is_no_oom_and_an_unknown_count_names_both() -> None:
    assert "oom" not in _said(0).lower() and "did not change" in _said(0)
    assert "SIGKILL or the OOM killer?" in _said(None)


def test_the_count_is_the_difference_of_the_manifests_two_readings(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.manifest.write_text(json.dumps({"oom_kills_at_start": 3, "oom_kills_at_end": 4}))
    assert _oom_kills(run) == 1
    run.manifest.write_text(json.dumps({"oom_kills_at_start": 3}))
    assert _oom_kills(run) is None

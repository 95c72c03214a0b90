"""The preflight command's own parts: bad flags (exit 2), the deadline watcher, and the terminal table."""

from __future__ import annotations

import io

from click.testing import CliRunner
from rich.console import Console

from ddpdoctor.commands.preflight import Deadline, build_report, command, render_checks
from ddpdoctor.preflight.merge import MergeOptions, merge
from ddpdoctor.renderers.console import render
from ddpdoctor.rundir.layout import RunDir
from tests.unit.test_preflight_merge import _healthy


def test_bad_flags_exit_2(tmp_path):
    runner = CliRunner()
    for args in (["--max-size", "12"], ["--slow-rank-share", "1.5"], ["--check-timeout", "0"], ["--min-busbw", "-1"]):
        res = runner.invoke(command, [*args, "--out", str(tmp_path / "run")])
        assert res.exit_code == 2, (args, res.output)
        assert res.output.startswith("ddpdoctor: error: ") and "Traceback" not in res.output
    res = runner.invoke(command, ["--launcher", "none", "--out", str(tmp_path / "run")], env={"MASTER_PORT": "abc"})
    assert res.exit_code == 2 and "MASTER_PORT must be a port number" in res.output
    assert not (tmp_path / "run").exists()  # nothing launched


class _Job:
    killed_by = None

    def kill(self, reason: str) -> None:
        self.killed_by = reason


def test_deadline_kills_once_overdue():
    watcher, job = Deadline(0.0), _Job()
    watcher.start(None)  # type: ignore[arg-type]
    watcher.check(job)  # type: ignore[arg-type]
    assert job.killed_by == "preflight deadline of 0 s"
    patient, job2 = Deadline(3600.0), _Job()
    patient.check(job2)  # type: ignore[arg-type]
    assert job2.killed_by is None


def test_terminal_table_and_json_shape(tmp_path):
    recs = _healthy()
    recs[1]["versions"]["nccl"] = "2.21.5"
    checks = merge(recs, MergeOptions(min_busbw_gbps=0.5))
    report = build_report(checks, RunDir(tmp_path), 12.345, None)
    data = report.to_json()
    assert data["status"] == "error" and [f["id"] for f in data["findings"]] == ["preflight.versions"]
    assert {"id", "status", "evidence"} <= set(data["checks"][0])
    buf = io.StringIO()
    render(report, sections=render_checks, out=Console(file=buf, width=200, highlight=False))
    text = buf.getvalue()
    assert "launcher_env" in text and "differs across ranks: nccl" in text
    assert "#       size         count      type   redop     time   algbw   busbw" in text
    assert "busbw 1.00 GB/s >= --min-busbw 0.5 GB/s" in text

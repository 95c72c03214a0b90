"""The live commands' bad-input paths: one line on stderr, exit 2, before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.launch import runlock
from tests.conftest import run_cli


def test_bad_metrics_addr_is_bad_input_before_the_launch(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('must not run')\n")
    proc = run_cli("run", "--metrics-addr", "9464", "--out", str(tmp_path / "run"), str(script))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--metrics-addr" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_capture_needs_exactly_one_kind_and_a_live_job(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "profile", "finished": False}))
    both = run_cli("capture", str(tmp_path), "--profile", "3", "--stacks")
    assert both.returncode == 2 and "exactly one" in both.stderr
    none = run_cli("capture", str(tmp_path), "--profile", "3")
    assert none.returncode == 2 and none.stderr.count("\n") == 1 and "not a live" in none.stderr
    lock = runlock.acquire(tmp_path)  # a live ddpdoctor holds its run
    try:
        st = run_cli("status", str(tmp_path))
    finally:
        lock.release()
    assert st.returncode == 0 and "starting" in st.stdout


@pytest.mark.parametrize("args", [["capture", "--profile", "0", "RUN"], ["capture", "--check-sync", "1000", "RUN"],
                                  ["capture", "--nope", "RUN"], ["analyze", "--workers", "0", "x"], ["nope"]])
def test_a_command_line_click_refuses_is_one_line_exit_2(args):
    # Issue 40 item 8: out-of-range counts (and every other usage error) printed click's three-line usage block.
    from click.testing import CliRunner

    from ddpdoctor.cli import main

    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpdoctor: error: ") and "--help" in lines[0], r.output

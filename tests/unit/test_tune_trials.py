"""`ddpdoctor tune`'s experiment runner without launching: the run directory it owns, and a signal that stops
one launch stops the experiment."""

from __future__ import annotations

import os

import pytest

from ddpdoctor.commands import tune_trials
from ddpdoctor.errors import BadInput
from ddpdoctor.launch.launcher import LaunchResult, LaunchSpec
from ddpdoctor.rundir.layout import RunDir


def test_the_run_directory_is_refused_when_it_holds_a_tune_unless_overwrite(tmp_path):
    root = tmp_path / "run"
    tune_trials.prepare_root(root, overwrite=False)
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    (root / "report.json").write_text("{}")
    with pytest.raises(BadInput, match="already holds a run"):
        tune_trials.prepare_root(root, overwrite=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    os.symlink(outside, root / "trials")  # a link planted where a tune writes: removed, never followed
    tune_trials.prepare_root(root, overwrite=True)
    assert not (root / "report.json").exists() and not (root / "trials").exists() and (outside / "keep").exists()
    (root / "manifest.json").write_text("{}")
    with pytest.raises(BadInput, match="another command"):
        tune_trials.prepare_root(root, overwrite=True)


def test_a_signal_during_a_launch_stops_the_experiment(tmp_path, monkeypatch):
    import ddpdoctor.launch.launcher as launcher

    calls = []

    def fake_launch(spec, watcher=None):
        calls.append(spec.run_dir.root)
        return LaunchResult(exit_code=130, run_dir=spec.run_dir, duration_s=0.1, signum=2)

    monkeypatch.setattr(launcher, "launch", fake_launch)
    base = LaunchSpec(mode="tune", script="train.py", script_args=[], run_dir=RunDir(tmp_path / "x"))
    exp = tune_trials.Experiment(base, tmp_path, (None, 600.0, "kill"), 3, 3, show=False)
    with pytest.raises(tune_trials.Stopped) as stopped:
        exp.run({"bucket_cap_mb=1": {"bucket_cap_mb": 1.0}}, rounds=2)
    assert stopped.value.signum == 2 and len(calls) == 1

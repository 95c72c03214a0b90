"""Progress output: only for a person at a terminal, and what it says as a job advances (rank state as data)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.renderers import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clean_env(monkeypatch):
    for var in (*progress.CI_VARS, "DDPDOCTOR_PROGRESS", "TERM"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_only_on_a_terminal_never_under_json_or_ci(clean_env):
    assert progress.enabled(False, _Tty())
    assert not progress.enabled(True, _Tty())  # --json
    assert not progress.enabled(False, io.StringIO())  # a pipe or a log file
    clean_env.setenv("CI", "true")
    assert not progress.enabled(False, _Tty())
    clean_env.delenv("CI")
    clean_env.setenv("TERM", "dumb")
    assert not progress.enabled(False, _Tty())


@dataclass
class _Link:
    beat: dict[str, Any] | None = None
    exit: dict[str, Any] | None = None


@dataclass
class _Monitor:
    links: dict[int, _Link] = field(default_factory=dict)
    world_size: int | None = 2


@dataclass
class _RunDir:
    root: Path
    traces: list[Path] = field(default_factory=list)

    def trace_files(self) -> list[Path]:
        return self.traces


@dataclass
class _Spec:
    run_dir: _RunDir


def test_launch_progress_lines(tmp_path, capsys):
    mon = _Monitor()
    watch = progress.LaunchProgress(mon, window=(3, 5), world=2)
    watch.spec = _Spec(_RunDir(tmp_path))
    watch.update(0.0)
    assert capsys.readouterr().err == ""  # nobody connected yet
    mon.links = {0: _Link({"step": 1}), 1: _Link({"step": 0, "collective": {"step": 1}})}
    watch.update(1.0)
    err = capsys.readouterr().err
    assert "2/2 rank(s) connected" in err and "steps seen: rank 0 1, rank 1 1" in err
    mon.links[0].beat, mon.links[1].beat = {"step": 3}, {"step": 4}
    watch.update(2.0)  # within 5 s of the last steps line: no new one, but the window started
    err = capsys.readouterr().err
    assert "profiling: recording steps 3-5" in err and "steps seen" not in err
    watch.spec.run_dir.traces = [tmp_path / "rank0.pt.trace.json.gz", tmp_path / "rank1.pt.trace.json.gz"]
    mon.links[0].exit = {"steps_completed": 30}
    watch.update(9.0)
    err = capsys.readouterr().err
    assert "profiling: 2 trace(s) written" in err and "rank 0 30" in err
    watch.update(20.0)
    assert capsys.readouterr().err == ""  # nothing changed: nothing printed


def test_with_progress_leaves_the_watcher_alone_when_off(clean_env):
    sentinel = object()
    assert progress.with_progress(sentinel, {"--nproc-per-node": "2"}, as_json=True) is sentinel
    clean_env.setenv("DDPDOCTOR_PROGRESS", "1")
    wrapped = progress.with_progress(_Monitor(), {"--nproc-per-node": "2", "--nnodes": "2"}, as_json=False)
    assert isinstance(wrapped, progress.LaunchProgress) and wrapped.world == 4 and wrapped.world_size == 2

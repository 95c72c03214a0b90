"""A rank whose script returned (exit status 0) while its process stays alive (a thread that is not a daemon) keeps
torchrun and ddpdoctor alive: after the hang timeout the monitor calls it a `teardown` hang, naming the rank and
its stack (hang-teardown-2r; docs/accuracy.md miss 4). No launch: a monitor with hand-made links, the test process
standing in for the lingering rank (its pid is the job's root, so it is "in the tree")."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from ddpdoctor.findings.hang import hang_findings
from ddpdoctor.launch import monitor as monitor_mod
from ddpdoctor.launch.monitor import HangMonitor, RankLink


def _monitor(exit_ago: float, monkeypatch: pytest.MonkeyPatch) -> HangMonitor:
    monkeypatch.setattr(monitor_mod, "py_spy_dump", lambda pid: 'Thread 7 (idle): "Thread-1 (sleep)"\n    sleep')
    monkeypatch.setattr(monitor_mod, "say", lambda line: None)
    mon = HangMonitor(hang_timeout=3.0, startup_timeout=20.0, on_hang="report")
    mon.world_size = 2
    mon.root_pid = os.getpid()
    now = time.time()
    done = {"exit_code": 0, "exception": None, "steps_completed": 8}
    mon.links = {0: RankLink(0, pid=None, beat={"step": 8}, exit=done, exit_at=now - exit_ago),
                 1: RankLink(1, pid=os.getpid(), beat={"step": 8}, exit=done, exit_at=now - exit_ago)}
    return mon


def test_a_rank_alive_a_hang_timeout_after_its_script_returned_is_a_teardown_hang(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mon = _monitor(10.0, monkeypatch)
    monkeypatch.setattr(monitor_mod, "activity", lambda pid, *a, **k: (5, 0))  # quiet: the same counts each time
    job = SimpleNamespace(started=time.time() - 60)
    mon._check_teardown(job, time.time() - 5.0)  # type: ignore[arg-type]  # first look: quiet since then
    assert mon.hang is None
    mon._check_teardown(job, time.time())  # type: ignore[arg-type]
    assert mon.hang is not None
    d = mon.hang["diagnosis"]
    assert d["kind"] == "teardown" and d["culprit_ranks"] == [1]  # rank 0's process is gone: not named
    assert "Thread-1" in (mon.hang["stacks"]["1"] or "")
    (f,) = hang_findings(mon.hang)
    assert f.ranks == [1] and "daemon" in f.advice


def test_a_rank_that_just_finished_or_is_still_working_is_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    mon = _monitor(0.5, monkeypatch)
    mon._check_teardown(SimpleNamespace(started=time.time() - 60), time.time())  # type: ignore[arg-type]
    assert mon.hang is None
    # still working in an atexit handler (a profile's export): its main thread's counts move
    mon = _monitor(10.0, monkeypatch)
    ticks = iter(range(100))
    monkeypatch.setattr(monitor_mod, "activity", lambda pid, *a, **k: (next(ticks), 0))
    job = SimpleNamespace(started=time.time() - 60)
    for ago in (8.0, 4.0, 0.0):
        mon._check_teardown(job, time.time() - ago)  # type: ignore[arg-type]
    assert mon.hang is None

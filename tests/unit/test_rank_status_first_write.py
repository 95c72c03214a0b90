"""A rank's status.json says where it failed from its first write: torchrun may kill the rank (a peer aborted) while
its profiler exports, before the final write (seen once: a collective mismatch then lacked rank 1's call site)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpdoctor.probes.bootstrap import RankSession
from ddpdoctor.probes.config import ProbeConfig
from ddpdoctor.probes.heartbeat import HeartbeatProbe


class KilledDuringExport(BaseException):
    """Stands for the end of the process in the middle of profiler.finish()."""


class ExportKilled:
    written: list[Path] = []

    def finish(self) -> None:
        raise KilledDuringExport


@pytest.mark.parametrize("failed", [True, False])
def test_status_has_the_failed_collective_before_the_profiler_finishes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       failed: bool) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    session = RankSession(ProbeConfig(mode="profile", run_dir=str(tmp_path), script="train.py"))
    probe = HeartbeatProbe("127.0.0.1:9", 1, 2, session.tracker, tmp_path / "stacks.txt")
    probe.backward_site = "/job/train.py:13"
    if failed:
        probe.failed_collective = {"op": "backward (DDP gradient all-reduce)", "call_site": "/job/train.py:13",
                                   "error": "RuntimeError: Connection reset by peer"}
    session.extra.append(probe)
    session.profiler = ExportKilled()
    with pytest.raises(KilledDuringExport):
        session.finish({"exit_code": 1, "exception": "RuntimeError: Connection reset by peer"})
    status = json.loads(session.run.rank_file(1, "status.json").read_text())
    assert status["last_collective"]["call_site"] == "/job/train.py:13"
    assert ("failed_collective" in status) is failed
    if failed:
        assert status["failed_collective"]["call_site"] == "/job/train.py:13"

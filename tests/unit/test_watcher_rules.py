"""Pure rules of the watcher: how a run ended (manifest), a rank that left early, long stalls, the run-dir lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.findings.crash import crash_findings
from ddpdoctor.findings.hang import stall_findings
from ddpdoctor.findings.job import ended_findings
from ddpdoctor.launch import runlock
from ddpdoctor.report import Report
from ddpdoctor.rundir.schema import Manifest, RunEnded

VICTIM = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:6558"


def test_a_rank_that_returned_before_the_victims_failed_is_the_culprit() -> None:
    statuses = {
        0: {"exit_code": 0, "steps_completed": 4, "ended_at": 100.0, "exit_site": "train.py:12",
            "last_collective": {"op": "all_reduce", "call_site": "train.py:30"}},
        1: {"exit_code": 1, "exception": VICTIM, "ended_at": 100.4,
            "failed_collective": {"op": "allreduce", "group": "default_pg", "seq": 9, "call_site": "train.py:30"}},
    }
    (f,) = crash_findings(statuses)
    assert f.id == "rank-left-early" and f.ranks == [0]
    assert f.evidence["call_site"] == "train.py:12" and f.evidence["step"] == 4 and f.evidence["victims"] == [1]
    # Without an exit site (the script just ended): its last collective's call site.
    del statuses[0]["exit_site"]
    (f,) = crash_findings(statuses)
    assert f.evidence["call_site"] == "train.py:30" and "after its last collective at train.py:30" in f.title


def test_a_rank_killed_by_sigterm_or_ending_after_the_failure_is_not_left_early() -> None:
    victim = {"exit_code": 1, "exception": VICTIM, "ended_at": 100.0}
    killed = {"exit_code": 143, "signal": "SIGTERM", "ended_at": 99.0}
    later = {"exit_code": 0, "ended_at": 101.0}
    # Killed by a signal before the peer's failure: the signalled rank is the culprit (rank 0 is a rank like any
    # other: issue 40 item 6); ending cleanly after it: the first victim is.
    for other, culprit in ((killed, [0]), (later, [1])):
        (f,) = crash_findings({0: other, 1: victim})
        assert f.id == "rank-crashed" and f.ranks == culprit
    # A real root cause stays the root cause.
    root = {"exit_code": 1, "exception": "ValueError: bad batch", "ended_at": 100.2}
    ids = {(f.id, tuple(f.ranks)) for f in crash_findings({0: {"exit_code": 0, "ended_at": 99.0}, 1: victim, 2: root})}
    assert ids == {("rank-crashed", (2,))}


@pytest.mark.parametrize(("sig", "num", "status", "words"), [
    ("SIGINT", 2, "interrupted", "Interrupted by the user"),
    ("SIGTERM", 15, "stopped", "preempted or time limit?"),
    ("SIGHUP", 1, "stopped", "terminal or ssh session closed"),
])
def test_a_signal_is_a_status_and_an_exit_code_not_an_error(sig: str, num: int, status: str, words: str) -> None:
    manifest = Manifest(finished=True, ended=RunEnded(how="signal", signal=sig, signum=num, exit_code=128 + num))
    (f,), stopped = ended_findings(manifest, locked=False)
    assert f.id == "job-stopped" and f.severity.value == "warning" and words in f.title
    assert stopped is not None and stopped["exit_code"] == 128 + num
    report = Report("run", findings=[f], stopped=stopped)
    assert report.status == status and report.to_json()["stopped"]["signal"] == sig


def test_an_unfinished_manifest_is_a_killed_ddpdoctor_only_when_no_one_holds_the_lock() -> None:
    manifest = Manifest(finished=False, ended=RunEnded(how="running"))
    assert ended_findings(manifest, locked=True) == ([], None)  # still running
    (f,), _ = ended_findings(manifest, locked=False)
    assert f.id == "run-unfinished"
    assert ended_findings(Manifest(finished=True), locked=False) == ([], None)


def test_long_stalls_are_warnings_with_their_stack() -> None:
    (f,) = stall_findings([{"rank": 0, "step": 4, "call_site": "ckpt.py:3", "stalled_s": 75.2, "stack": "..."},
                           {"rank": "x"}, "junk"])  # type: ignore[list-item]
    assert f.id == "long-stall" and f.severity.value == "warning" and f.ranks == [0] and "75.2 s" in f.title


def test_a_live_run_locks_its_directory_and_only_its_own_job_may_join(tmp_path: Path) -> None:
    lock = runlock.acquire(tmp_path)
    assert runlock.is_locked(tmp_path)
    with pytest.raises(BadInput, match="in use by a live run"):
        runlock.acquire(tmp_path)
    lock.release()
    assert not runlock.is_locked(tmp_path)
    # Nodes of one job share the directory; another job (or a single-node run) is refused.
    a = runlock.acquire(tmp_path, job_id="job42")
    b = runlock.acquire(tmp_path, job_id="job42")
    with pytest.raises(BadInput):
        runlock.acquire(tmp_path, job_id="job43")
    with pytest.raises(BadInput):
        runlock.acquire(tmp_path)
    a.release()
    b.release()
    assert (tmp_path / runlock.LOCK_NAME).stat().st_mode & 0o077 == 0


def test_the_lock_is_released_when_its_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[2]); from ddpdoctor.launch import runlock; "
        "runlock.acquire(__import__('pathlib').Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"),
        str(tmp_path), str(Path(__file__).resolve().parents[2])], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    assert runlock.is_locked(tmp_path)
    holder.kill()
    holder.wait()
    assert not runlock.is_locked(tmp_path)
    fd = os.open(tmp_path / runlock.LOCK_NAME, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)


_STARTUP_TABLE = """[W1129 07:07:04] Sending process 10215 closing signal SIGTERM
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
bootstrap.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_07:07:04
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10215)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 10215
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_07:07:04
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -{num} (pid: 10216)  ({sig})
  error_file: <N/A>
  traceback : Signal {num} ({sig}) received by PID 10216
=======================================================
"""


@pytest.mark.parametrize(("sig", "num"), [("SIGKILL", 9), ("SIGHUP", 1), ("SIGUSR1", 10)])
def test_a_signal_the_probe_cannot_see_at_start_up_blames_that_rank_only(tmp_path: Path, sig: str, num: int) -> None:
    # Issue 40 item 6: a rank ended at start-up by a signal other than SIGTERM left no status, nor did the rank
    # torchrun then stopped: both were "ended without a status". torchrun's failure table names the first one.
    from ddpdoctor.reports.watched import _first_signalled, torn_down_ranks
    from ddpdoctor.rundir.layout import RunDir

    (tmp_path / "torchrun").mkdir()
    (tmp_path / "torchrun" / "torchrun.log").write_text(_STARTUP_TABLE.format(sig=sig, num=num))
    run = RunDir(tmp_path)
    statuses = {0: None, 1: None}
    torn = torn_down_ranks(run, statuses)
    assert torn == {0}
    found = crash_findings(statuses, torn_down=torn, first_signalled=_first_signalled(run, statuses))
    assert [(f.id, f.ranks) for f in found] == [("rank-crashed", [1])]
    assert f"killed by {sig}" in found[0].title and found[0].evidence["victims"] == [0]

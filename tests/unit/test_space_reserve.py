"""The space held back for a run's last writes (ddpdoctor/rundir/reserve.py) and the `disk-full` finding it feeds
(docs/findings.md#job-disk-full): by hand, on the local disk; the real full disk is tests/e2e/test_disk_full.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import msgspec

from ddpdoctor.findings.job import disk_full_findings, job_findings
from ddpdoctor.rundir import reserve as reserve_mod
from ddpdoctor.rundir.reserve import SpaceReserve
from ddpdoctor.rundir.schema import Manifest


def _held(r: SpaceReserve) -> dict[str, int]:
    """What the reserve holds (nameless files: nothing of it is in the folder, whatever happens to ddpdoctor)."""
    assert not [p for p in r.root.iterdir() if ".reserve." in p.name]
    return {name: os.fstat(fd).st_blocks * 512 for name, fd in r.held}


def test_reserve_holds_real_blocks_and_gives_them_back_in_two_halves(tmp_path: Path) -> None:
    r = SpaceReserve(tmp_path, total=256 << 10)
    r.hold()
    held = _held(r)
    assert set(held) == set(reserve_mod.NAMES) and all(v >= 128 << 10 for v in held.values())  # not sparse
    assert r.facts() is None  # nothing happened: nothing goes into the manifest
    r.note(tmp_path / "ranks" / "rank0" / "stdout.log", OSError(errno.ENOSPC, "No space left on device"))
    assert set(_held(r)) == {".ddpdoctor.reserve.final"}  # the ranks' half is theirs now
    r.note(tmp_path / "ranks" / "rank0" / "stdout.log", OSError(errno.ENOSPC, "No space left on device"))
    r.release()
    assert _held(r) == {}
    facts = r.facts()
    assert facts is not None and facts["full_after_s"] is not None
    assert facts["unwritten"] == [{"path": "ranks/rank0/stdout.log", "error": "No space left on device"}]


def test_tick_sees_the_disk_full_once(tmp_path: Path, monkeypatch) -> None:
    free = [10 << 20]
    monkeypatch.setattr(reserve_mod, "free_bytes", lambda path: free[0])
    r = SpaceReserve(tmp_path, total=64 << 10)
    r.hold()
    r.tick(now=r.started + 1)
    assert r.full_after_s is None and len(_held(r)) == 2
    free[0] = 4096
    r.tick(now=r.started + 1.2)  # within CHECK_EVERY_S of the last look: not asked
    assert r.full_after_s is None
    r.tick(now=r.started + 2)
    assert r.full_after_s == 2.0 and r.min_free == 4096 and len(_held(r)) == 1
    r.release()


def test_reserve_that_does_not_fit_is_said(tmp_path: Path, monkeypatch) -> None:
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reserve_mod.os, "posix_fallocate", no_room)
    monkeypatch.setattr(reserve_mod.os, "write", lambda fd, data: no_room(fd, 0, 0))
    r = SpaceReserve(tmp_path, total=64 << 10)
    r.hold()
    assert r.held == [] and r.short and _held(r) == {}


def test_a_killed_launcher_leaves_no_reserve_file(tmp_path: Path) -> None:
    # Issue 40 item 9: a SIGKILLed ddpdoctor (and a node that returned early) left 256 KiB of reserve files.
    import subprocess
    import sys

    code = ("import os, signal, sys; from ddpdoctor.rundir.reserve import SpaceReserve; "
            "r = SpaceReserve(sys.argv[1], total=256 << 10); r.hold(); assert len(r.held) == 2; "
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_disk_full_finding_by_hand() -> None:
    facts = {"full_after_s": 11.7, "min_free_bytes": 0, "reserve_bytes": 262144, "reserve_short": False,
             "unwritten": [{"path": "ranks/rank1/stdout.log", "error": "No space left on device"}]}
    manifest = msgspec.convert({"exit_code": 0, "disk_full": facts}, Manifest)
    statuses = {0: {"exit_code": 0, "steps_completed": 11, "ddp_modules": 1}, 1: None}
    (f,) = disk_full_findings(manifest, statuses)
    assert f.id == "disk-full" and f.severity.value == "warning" and f.ranks == [1]
    assert "11.7 s into the run" in f.title and "ranks/rank1/stdout.log" in f.title and "rank(s) [1]" in f.title
    # the job exited 0: the missing status did not fit, it is not a rank killed by a signal
    assert [x.id for x in job_findings(manifest, statuses)] == []
    # a failed job keeps rank-no-status beside it (the data cannot tell a kill from a status that did not fit)
    assert [x.id for x in job_findings(msgspec.structs.replace(manifest, exit_code=1), statuses)] == ["rank-no-status"]
    assert disk_full_findings(Manifest(exit_code=0), statuses) == []


def test_a_rank_status_waits_a_little_for_room(tmp_path: Path, monkeypatch) -> None:
    """probes/bootstrap.py: the rank's status on a full disk is tried again for a few seconds (the launcher gives
    the ranks' half of the reserve back within half a second); any other error is given up at once."""
    from ddpdoctor.probes import bootstrap

    tries: list[int] = []

    def flaky(path: Path, data: object) -> None:
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        path.write_text("ok")

    monkeypatch.setattr(bootstrap, "write_json", flaky)
    monkeypatch.setattr(bootstrap.time, "sleep", lambda s: None)
    bootstrap._write_quietly(tmp_path / "status.json", {}, wait_s=3.0)
    assert len(tries) == 3 and (tmp_path / "status.json").read_text() == "ok"
    tries.clear()
    monkeypatch.setattr(bootstrap, "write_json", lambda p, d: (tries.append(1), (_ for _ in ()).throw(
        OSError(errno.EACCES, "Permission denied"))))
    bootstrap._write_quietly(tmp_path / "other.json", {}, wait_s=3.0)
    assert len(tries) == 1  # not a full disk: no waiting
    tries.clear()
    monkeypatch.setattr(bootstrap, "write_json", lambda p, d: (tries.append(1), (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device"))))
    bootstrap._write_quietly(tmp_path / "never.json", {})  # no wait asked: one try, quietly
    assert len(tries) == 1


def test_a_manifest_end_that_did_not_fit_is_still_this_processs_verdict(tmp_path: Path, monkeypatch) -> None:
    # Issue 40 item 7: with 40 KiB free, the manifest's end did not fit, so the report read the manifest's start
    # ("running") and a rank whose status did not fit as "killed by a signal?": a healthy job exited 1.
    import json

    import pytest

    from ddpdoctor.rundir import manifest as manifest_mod
    from ddpdoctor.rundir.artefacts import DiskFull
    from ddpdoctor.rundir.layout import RunDir

    run = RunDir(tmp_path / "run")
    (run.root / "ranks" / "rank0").mkdir(parents=True)
    (run.root / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    monkeypatch.setenv("DDPDOCTOR_TEST_ENOSPC", "manifest.json")
    facts = {"full_after_s": 0.1, "min_free_bytes": 0, "reserve_bytes": 262144, "reserve_short": True,
             "unwritten": [{"path": "ranks/rank0/status.json", "error": "No space left on device"}]}
    with pytest.raises(DiskFull):
        manifest_mod.finalize(run, exit_code=0, duration_s=3.0, killed_by=None, disk_full=facts)
    assert json.loads((run.root / "manifest.json").read_text())["finished"] is False  # on disk: as it was
    manifest = manifest_mod.load_typed(run)
    assert manifest.finished and manifest.exit_code == 0
    ids = [f.id for f in job_findings(manifest, {0: None})] + [f.id for f in disk_full_findings(manifest, {0: None})]
    assert "rank-no-status" not in ids and "disk-full" in ids

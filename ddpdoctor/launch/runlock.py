"""The run directory's lock: a live run holds RUN/.ddpdoctor.lock (flock), so a second launch into it is refused.

One job, many launchers: the nodes of one multi-node job (or every rank under --launcher none) pass the same
``job_id`` and share the directory; a launch with another job id, or none, is still refused. The first holder
takes the lock exclusively, writes its job id into RUN/.ddpdoctor.job, then downgrades to a shared lock;
a later launcher that cannot lock exclusively but can share it joins when the job ids match.

flock works on local filesystems and on NFSv4 (Linux emulates it with POSIX locks there)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.rundir.private import open_private

LOCK_NAME = ".ddpdoctor.lock"
JOB_NAME = ".ddpdoctor.job"
JOIN_WAIT_S = 3.0  # a peer of the same job may be between its exclusive lock and writing its job id


class RunLock:
    """Held for the whole launch; the file descriptor is not inherited by the job (close-on-exec)."""

    def __init__(self, root: Path, fd: int, shared: bool) -> None:
        self.root = root
        self.fd = fd
        self.shared = shared

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1


def holder(root: Path) -> str:
    """Who holds the lock, as its holder wrote it ("pid 123 on host"), for the refusal message."""
    try:
        info = json.loads((root / LOCK_NAME).read_text()[:4096] or "{}")
        return f"ddpdoctor pid {info.get('pid')} on {info.get('host')}"
    except (OSError, ValueError, AttributeError):
        return "another ddpdoctor"


def is_locked(root: Path) -> bool:
    """True while a live run holds the directory (for readers such as `analyze` telling "running" from "killed")."""
    try:
        fd = os.open(root / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def acquire(root: Path, job_id: str | None = None) -> RunLock:
    """Lock ``root`` for this launch, or raise BadInput naming the live run that holds it."""
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Never through a link: a lock name planted as a link would have its target truncated (docs/trust.md).
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise BadInput(f"cannot write the run directory ({exc.strerror or exc})", root) from exc
    deadline = time.time() + (JOIN_WAIT_S if job_id is not None else 0.0)
    other_job = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass
        else:
            _write_holder(fd, root)
            if job_id is None:
                return RunLock(root, fd, shared=False)
            with os.fdopen(open_private(root / JOB_NAME), "w") as jf:
                jf.write(job_id)
            fcntl.flock(fd, fcntl.LOCK_SH)  # let the job's other launchers in
            return RunLock(root, fd, shared=True)
        if job_id is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                pass
            else:
                try:
                    same = (root / JOB_NAME).read_text()[:1024] == job_id
                except OSError:
                    same = False
                if same:
                    return RunLock(root, fd, shared=True)
                fcntl.flock(fd, fcntl.LOCK_UN)
                other_job = True  # a live job of another id shares it: no reason to wait
        if other_job or time.time() >= deadline:
            who = holder(root)
            os.close(fd)
            raise BadInput(f"is in use by a live run ({who}); wait for it to end or choose another --out/--name", root)
        time.sleep(0.1)


def _write_holder(fd: int, root: Path | None = None) -> None:
    data = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode()
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
    except OSError as exc:  # a full disk (0 bytes free): one line, not a traceback
        from ddpdoctor.rundir.artefacts import write_error

        os.close(fd)
        raise write_error(exc, (root or Path(".")) / LOCK_NAME) from exc

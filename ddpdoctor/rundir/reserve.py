"""Space held back in the run directory for the last writes of a run on a disk that fills (docs/trust.md).

A disk that fills while the job runs (a checkpoint larger than the free space, another job) would leave the ranks
without room for their status.json and ddpdoctor without room for the manifest's end and the report: the run would
read "running" forever and a healthy rank as killed. So the launcher holds two small files of real blocks in the run
directory: the first is let go as soon as the disk is seen full (the ranks' own last records, the logs' tails), the
second right before the manifest is finalised and the report saved. Every write that still fails is noted
(``note``) and the manifest records what happened (``facts``: its ``disk_full``), so the report says what the run
lacks instead of guessing."""

from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.jsontypes import JsonObject
from ddpdoctor.rundir.private import open_private

RESERVE_ENV = "DDPDOCTOR_SPACE_RESERVE_KB"
DEFAULT_KB = 256  # half for the ranks once the disk is full, half for the manifest and the report
LOW_WATER_BYTES = 64 << 10  # less than this free: the disk is full for practical purposes
CHECK_EVERY_S = 0.5  # one statvfs per half second: nothing next to the 0.1 s watch loop
# What each reserve is for. Each is a file without a name (O_TMPFILE, else unlinked at once) held open by the
# launcher: its blocks are the run's while ddpdoctor lives, and the kernel gives them back when it ends however it
# ends (a SIGKILLed ddpdoctor, a node that returns early, used to leave 256 KiB of named files behind).
NAMES = (".ddpdoctor.reserve.ranks", ".ddpdoctor.reserve.final")
MAX_NOTED = 64  # a run that cannot write fails the same way many times: the first few name the files


def reserve_bytes() -> int:
    try:
        kb = int(os.environ.get(RESERVE_ENV, DEFAULT_KB))
    except ValueError:
        kb = DEFAULT_KB
    return max(0, kb) << 10


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem of ``path`` (None when it cannot be asked)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


class SpaceReserve:
    """The two reserve files of one launch, the moment the disk was seen full, and the writes that failed."""

    def __init__(self, root: Path, total: int | None = None) -> None:
        self.root = Path(root)
        self.total = reserve_bytes() if total is None else total
        self.held: list[tuple[str, int]] = []  # (name, open descriptor of the nameless file)
        self.started = time.time()
        self.full_after_s: float | None = None
        self.min_free: int | None = None
        self.unwritten: list[dict[str, str]] = []
        self.short = False  # the reserve itself did not fit: the disk was nearly full at the start
        self._next_check = 0.0
        self._lock = threading.Lock()

    def hold(self) -> None:
        """Create the reserve files (real blocks, not a sparse file); quietly fewer when they do not fit."""
        part = self.total // len(NAMES)
        for name in NAMES if part else ():
            try:
                fd = _nameless(self.root, name)
            except (OSError, BadInput):
                self.short = True
                continue
            try:
                try:
                    os.posix_fallocate(fd, 0, part)
                except OSError:  # a filesystem without fallocate: write the blocks
                    os.ftruncate(fd, 0)
                    chunk = b"\0" * 65536
                    for _ in range(0, part, len(chunk)):
                        os.write(fd, chunk)
                self.held.append((name, fd))
            except OSError:
                self.short = True
                os.close(fd)

    def tick(self, now: float | None = None) -> None:
        """From the launcher's watch loop: when the disk is (nearly) full, let the ranks' half go, once."""
        now = time.time() if now is None else now
        if now < self._next_check:
            return
        self._next_check = now + CHECK_EVERY_S
        free = free_bytes(self.root)
        if free is None:
            return
        self.min_free = free if self.min_free is None else min(self.min_free, free)
        if free < LOW_WATER_BYTES and self.full_after_s is None:
            self.full_after_s = round(now - self.started, 1)
            self.release(NAMES[0])

    def note(self, path: Path | str, exc: BaseException) -> None:
        """A write of ddpdoctor's that failed (from any thread): named in the manifest, the disk marked full."""
        import errno

        from ddpdoctor.rundir.artefacts import DiskFull

        full = isinstance(exc, DiskFull) or getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        with self._lock:
            if full and self.full_after_s is None:
                self.full_after_s = round(time.time() - self.started, 1)
            where = _relative(path, self.root)
            if len(self.unwritten) < MAX_NOTED and not any(u["path"] == where for u in self.unwritten):
                reason = getattr(exc, "problem", None) or getattr(exc, "strerror", None) or str(exc)
                self.unwritten.append({"path": where, "error": str(reason)[:200]})
        if self.full_after_s is not None:
            self.release(NAMES[0])

    def release(self, name: str | None = None) -> None:
        """Let one reserve file go (``name``), or all of them: before the manifest is finalised."""
        for held in list(self.held):
            if name is None or held[0] == name:
                os.close(held[1])  # the last reference: the kernel frees its blocks
                self.held.remove(held)

    def facts(self) -> JsonObject | None:
        """The manifest's ``disk_full`` (docs/json.md): None when the disk never filled and every write fitted."""
        if self.full_after_s is None and not self.unwritten:
            return None
        return {"full_after_s": self.full_after_s, "min_free_bytes": self.min_free, "reserve_bytes": self.total,
                "reserve_short": self.short, "unwritten": list(self.unwritten)}


def _relative(path: Path | str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except (OSError, ValueError):
        return str(path)


def _nameless(root: Path, name: str) -> int:
    """A private file in ``root`` that has no name: O_TMPFILE where the filesystem has it, else a file created
    under an unpredictable name (O_EXCL|O_NOFOLLOW) and unlinked at once."""
    try:
        return os.open(root, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (OSError, AttributeError):
        pass
    path = root / f"{name}.{secrets.token_hex(8)}"
    fd = open_private(path)
    try:
        os.unlink(path)
    except OSError:
        os.close(fd)
        raise
    return fd

"""A small real filesystem for full-disk tests: a tmpfs of a given size, mounted on a fresh folder of its own
under /tmp (never under pytest's tmp_path: pytest renames old tmp_path folders, of this or a concurrent session,
to "garbage-..." to remove them, and a mount under one could then no longer be unmounted by its path, leaking it).
Needs root; the test is skipped where mount is refused. Unmounted (retried while busy, then lazily) and removed
on the way out."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def mount_small_tmpfs(size: str) -> Path | None:
    """A fresh folder with a tmpfs of ``size`` (e.g. "768k") mounted on it, or None where mount is refused."""
    where = Path(tempfile.mkdtemp(prefix="ddpdoctor-disk-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                      capture_output=True).returncode:
        where.rmdir()
        return None
    return where


def unmount(where: Path) -> None:
    for _ in range(20):  # a process of the job may still hold a file for a moment
        if subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
            break
        time.sleep(0.5)
    else:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


@contextmanager
def small_disk(size: str) -> Iterator[Path]:
    """``with small_disk("768k") as disk:`` a mounted tmpfs of that size, or the test is skipped."""
    where = mount_small_tmpfs(size)
    if where is None:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        unmount(where)

"""The user's own folders across repeated launches (`tune`): what the script writes there is put back after each
launch, so every trial starts from the state the user left and the folders end byte-identical.

A script that resumes from and saves a checkpoint beside itself (`ckpt.pt`) would otherwise be trained by every
launch of a tune (step 100 became 134), and each trial would start from another state, so the A/B compared
different training states. Before the first launch, the files of the script's folder and the working directory
(a few levels deep, bounded) are listed with their size, mtime and inode, and their bytes kept in a private copy
(up to a cap); after each launch, a file that changed or went away is written back from that copy, and a regular file
that appeared while the launch ran is removed (a file changed or made between launches, or before the tune, is
left alone; a file you edit in that folder *while* a launch runs is put back too: edit elsewhere during a tune). A changed file that was too large to keep is not guessed at: `FolderChanged` names it,
and the command says in one line how to run it (on a copy of the folder)."""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.safe_io import atomic_file

MAX_DEPTH = 3
MAX_ENTRIES = 20_000
MAX_KEPT_BYTES = 256 << 20  # the bytes kept of the user's files (a dataset beside the script is not copied)


class FolderChanged(Exception):
    """A launch changed a file of the user's that could not be put back."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


@dataclass
class _Entry:
    size: int
    mtime_ns: int
    ino: int
    mode: int
    kept: Path | None = None  # the private copy of its bytes, when kept


def _key(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ino


@dataclass
class FolderGuard:
    """The files of ``folders`` (not below ``skip``) as they were; ``keep`` is a private folder for their bytes."""

    folders: list[tuple[Path, int]]  # (folder, how many levels deep)
    skip: list[Path]
    keep: Path
    files: dict[Path, _Entry] = field(default_factory=dict)
    dirs: set[Path] = field(default_factory=set)
    complete: bool = True  # every entry listed (not cut at MAX_ENTRIES)
    restored: set[Path] = field(default_factory=set)  # what a launch changed and this put back (or removed)

    def snapshot(self) -> None:
        kept_bytes = 0
        self.keep.mkdir(mode=0o700, parents=True, exist_ok=True)
        for path, st in self._walk():
            if stat.S_ISDIR(st.st_mode):
                self.dirs.add(path)
                continue
            entry = _Entry(st.st_size, st.st_mtime_ns, st.st_ino, stat.S_IMODE(st.st_mode))
            if kept_bytes + st.st_size <= MAX_KEPT_BYTES:
                copy = self.keep / f"{len(self.files)}"
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as src, atomic_file(copy) as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    entry.kept = copy
                    kept_bytes += st.st_size
                except OSError:
                    pass
            self.files[path] = entry

    def _walk(self) -> list[tuple[Path, os.stat_result]]:
        out: list[tuple[Path, os.stat_result]] = []
        seen: set[Path] = set()
        todo = [(Path(os.path.abspath(f)), MAX_DEPTH - depth) for f, depth in self.folders]
        skip = [Path(os.path.abspath(s)) for s in self.skip]
        while todo:
            folder, depth = todo.pop()
            if folder in seen or any(folder == s or s in folder.parents for s in skip):
                continue
            seen.add(folder)
            try:
                names = sorted(os.listdir(folder))
            except OSError:
                continue
            for name in names:
                path = folder / name
                if any(path == s or s in path.parents for s in skip):
                    continue
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if len(out) >= MAX_ENTRIES:
                    self.complete = False
                    return out
                if stat.S_ISDIR(st.st_mode):
                    out.append((path, st))
                    if depth + 1 < MAX_DEPTH:
                        todo.append((path, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    out.append((path, st))
        return out

    def restore(self, since_ns: int) -> list[Path]:
        """Put the folders back as they were before the tune, for what changed since ``since_ns`` (the launch's
        start); the paths that had changed. FolderChanged for a changed file whose bytes were not kept (too large),
        before the next launch."""
        now = {p: st for p, st in self._walk()}
        changed: list[Path] = []
        for path, entry in self.files.items():
            st = now.get(path)
            if st is not None and stat.S_ISREG(st.st_mode) and _key(st) == (entry.size, entry.mtime_ns, entry.ino):
                continue
            changed.append(path)
            if entry.kept is None:
                raise FolderChanged(path, f"changed by the launch, and too large to keep a copy of "
                                          f"({entry.size >> 20} MiB)")
            self._put_back(path, entry)
        created = sorted((p for p, st in now.items() if p not in self.files and p not in self.dirs
                          and st.st_mtime_ns >= since_ns and st.st_uid == os.geteuid()),
                         key=lambda p: len(p.parts), reverse=True)
        for path in created:
            changed.append(path)
            try:
                if stat.S_ISDIR(now[path].st_mode):
                    os.rmdir(path)  # only once empty: what the launch made inside is removed first (deepest first)
                else:
                    os.unlink(path)
            except OSError:
                pass
        self.restored.update(changed)
        return changed

    def _put_back(self, path: Path, entry: _Entry) -> None:
        assert entry.kept is not None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(entry.kept, "rb") as src, atomic_file(path, entry.mode) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                os.fchmod(dst.fileno(), entry.mode)  # the file's own mode, not ddpdoctor's umask
            os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)
            st = os.lstat(path)
            entry.ino = st.st_ino  # renamed into place: a new inode, the same bytes, mode and mtime
        except OSError as exc:
            raise FolderChanged(path, f"changed by the launch and could not be put back ({exc.strerror or exc})") \
                from exc

    def drop(self) -> None:
        shutil.rmtree(self.keep, ignore_errors=True)

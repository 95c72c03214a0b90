"""Run-directory folders and files that never follow a link and never trust what another user made (docs/trust.md).

A run directory may sit on shared storage or under /tmp, where another local user can create names before
ddpdoctor does. So: ``claim_run_root`` creates ``--out`` owner-only or accepts an existing one only when it is a
real directory of this user that nobody else may write (else one BadInput line, exit 2); ``private_dir`` makes or
accepts a folder inside it on the same terms (0700); ``open_private`` opens a file for writing without following
a link (O_NOFOLLOW), refuses anything but this user's own regular file with one name, and leaves it 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ddpdoctor.errors import BadInput

# Writable by the group or by everyone: another user could plant a name in it (a link, a token, a rank log).
UNSAFE_BITS = stat.S_IWGRP | stat.S_IWOTH


def _uid() -> int:
    return os.geteuid()


def _owner_ok(st: os.stat_result) -> bool:
    return st.st_uid == _uid()


def _check_parents(path: Path) -> None:
    """The folders above a run directory must not let another user rename it away or swap it for a link: none is
    writable by everyone unless it is sticky (/tmp), and the nearest existing one (whose owner may rename what is
    in it, sticky or not) is this user's or root's. A group-writable folder above trusts that group (docs/trust.md)."""
    nearest = True
    for parent in path.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise BadInput(f"cannot check the folder above the run directory: {parent} ({exc.strerror or exc})",
                           path) from exc
        if nearest and st.st_uid not in (_uid(), 0):
            raise BadInput(f"the folder above it, {parent}, belongs to another user (uid {st.st_uid}), who could "
                           "replace the run directory; choose another --out", path)
        if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            raise BadInput(f"the folder above it, {parent}, is writable by every user without the sticky bit, so "
                           "anyone could replace the run directory; choose another --out", path)
        nearest = False


def check_private_dir(path: Path, what: str = "the run directory") -> os.stat_result:
    """lstat ``path`` and insist on a real directory (not a link) of this user that no one else may write."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise BadInput(f"cannot check {what} ({exc.strerror or exc})", path) from exc
    if stat.S_ISLNK(st.st_mode):
        raise BadInput(f"{what} is a symbolic link; refusing to write through it (give the real path)", path)
    if not stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{what} exists and is not a directory", path)
    if not _owner_ok(st):
        raise BadInput(f"{what} belongs to another user (uid {st.st_uid}); refusing to write into it, whoever "
                       "made it could have planted links or files there; choose another --out", path)
    if st.st_mode & UNSAFE_BITS:
        raise BadInput(f"{what} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}); another user "
                       "could plant links or files there: `chmod go-w` it or choose another --out", path)
    return st


def claim_run_root(root: Path) -> bool:
    """Create ``root`` (0700, folders above it with the usual modes) or accept it as it is when it is this user's
    own directory that nobody else may write; BadInput otherwise. True when this call created it."""
    root = Path(os.path.abspath(root))
    _check_parents(root)
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(root, 0o700)  # fails when the name exists (as a folder, a file or a link): checked below
        created = True
    except FileExistsError:
        created = False
    except OSError as exc:
        raise BadInput(f"cannot write the run directory ({exc.strerror or exc})", root) from exc
    check_private_dir(root)
    return created


def private_dir(path: Path, what: str | None = None) -> Path:
    """A folder inside the run directory, made 0700 or accepted when it is this user's own real directory (then
    made 0700 too); BadInput when it is a link or another user's."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        check_private_dir(path, what or f"{Path(path).name}/ in the run directory")
    except OSError as exc:
        raise BadInput(f"cannot write the run directory ({exc.strerror or exc})", path) from exc
    try:
        os.chmod(path, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        pass
    return Path(path)


_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_private(path: Path, append: bool = False) -> int:
    """A file descriptor to write ``path``: created 0600, or an existing regular file of this user with one name
    (emptied unless ``append``, then made 0600); never through a link. OSError as ``os.open`` raises it (ELOOP for
    a link), BadInput for a file another user could have planted."""
    fd = os.open(path, _WRITE_FLAGS | (os.O_APPEND if append else 0), 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not _owner_ok(st) or st.st_nlink > 1:
            raise BadInput("exists and is not this user's own file (another user's, a device or a hard link); "
                           "refusing to write into it", path)
        if stat.S_IMODE(st.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        if not append and st.st_size:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private_file(path: Path, mode: int = 0o600) -> None:
    """``path`` (a regular file or folder of this user's) chmodded to ``mode`` through an O_NOFOLLOW descriptor;
    anything else (a link, another user's file, a vanished one) is left as it is."""
    flags = os.O_DIRECTORY if mode & 0o100 else 0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | flags)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if _owner_ok(st) and (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            os.fchmod(fd, mode)
    except OSError:
        pass
    finally:
        os.close(fd)


def make_private_tree(folder: Path) -> None:
    """Every folder (0700) and regular file (0600) of this user's below ``folder``, changed through a descriptor
    opened with O_NOFOLLOW (never a link's target): for what libraries write with the user's umask (the profiler's
    traces inside the ranks, TensorBoard's event files)."""
    for root, dirs, files in os.walk(folder):
        for name, mode in [*((d, 0o700) for d in dirs), *((f, 0o600) for f in files)]:
            make_private_file(Path(root, name), mode)

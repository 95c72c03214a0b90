"""Who may see which run in the TensorBoard tab (docs/trust.md, "The TensorBoard tab").

TensorBoard serves whoever reaches its port, but a run directory is private (0700/0600): so the tab shows a
private run only to a request from the user who started TensorBoard (on loopback the kernel says whose socket
asks: /proc/net/tcp), and a run made readable by everyone (``chmod -R a+rX RUN``) to anyone. Runs of other users
are shown only when they made them readable by everyone. Only real folders and regular files inside the log dir
are served, never a link out of it."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_ESTABLISHED = "01"


def peer_uid(environ: Mapping[str, Any]) -> int | None:
    """The uid owning the client socket of this request, when it comes over loopback; None when unknown (another
    host, or no /proc): such a request sees only runs readable by everyone.

    The client's socket is the one established connection whose own end is exactly the request's address and port
    and whose far end is the server's port: both addresses are compared, not only the ports (a client may bind
    127.0.0.X with the server's port number, so that the server's own socket matched on ports alone). The uid is
    the kernel's record of who made that socket, which no other user can choose."""
    try:
        addr = ipaddress.ip_address(str(environ.get("REMOTE_ADDR", "")))
        client_port = int(environ.get("REMOTE_PORT") or 0)
        server_port = int(environ.get("SERVER_PORT") or 0)
    except ValueError:
        return None
    addr = _plain(addr)
    if not addr.is_loopback or not client_port or not server_port:
        return None
    uids: set[int] = set()
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                uids.update(socket_owners(fh, addr, client_port, server_port))
        except OSError:
            continue
    return uids.pop() if len(uids) == 1 else None


def _plain(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    mapped = getattr(addr, "ipv4_mapped", None)
    return mapped if mapped is not None else addr


def _endpoint(field: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int] | None:
    """/proc/net/tcp{,6}'s ``HEXADDR:HEXPORT`` (the address in 32-bit words of host order) as (address, port)."""
    hexaddr, _, hexport = field.partition(":")
    try:
        raw = bytes.fromhex(hexaddr)
        port = int(hexport, 16)
    except ValueError:
        return None
    words = b"".join(raw[i:i + 4][::-1] if sys.byteorder == "little" else raw[i:i + 4] for i in range(0, len(raw), 4))
    try:
        return _plain(ipaddress.ip_address(words)), port
    except ValueError:
        return None


def socket_owners(lines: Iterable[str], client: ipaddress.IPv4Address | ipaddress.IPv6Address, client_port: int,
                  server_port: int) -> list[int]:
    """The uids of the established sockets in a /proc/net/tcp table whose local end is ``client:client_port``
    and whose far end is a loopback address on ``server_port``."""
    out = []
    for i, line in enumerate(lines):
        f = line.split()
        if i == 0 or len(f) < 8 or f[3] != _ESTABLISHED:
            continue
        local, remote = _endpoint(f[1]), _endpoint(f[2])
        if local == (client, client_port) and remote is not None and remote[1] == server_port \
                and remote[0].is_loopback and f[7].isdigit():
            out.append(int(f[7]))
    return out


def regular_inside(path: Path, logdir: Path) -> os.stat_result | None:
    """lstat of ``path`` when it is a regular file (not a link) whose real path lies inside the log dir."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    real, top = os.path.realpath(path), os.path.realpath(logdir)
    return st if real == top or real.startswith(top.rstrip(os.sep) + os.sep) else None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_inside(logdir: Path, name: str) -> int | None:
    """A descriptor of the run folder ``name`` (relative to the log dir), each component opened from the one before
    with O_NOFOLLOW: a link anywhere below the log dir is refused, and once open, swapping a name for a link reads
    nothing else. None when it is not such a folder."""
    parts = [p for p in Path(name).parts if p not in ("", ".")]
    if any(p in ("..", "/") for p in parts):
        return None
    try:
        fd = os.open(logdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    for part in parts:
        try:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nfd
    return fd


def visible_fd(fd: int, viewer: int | None, server_uid: int | None = None) -> bool:
    """visible() on an open run folder: its own fstat and its report.json's, opened through it with O_NOFOLLOW."""
    server_uid = os.geteuid() if server_uid is None else server_uid
    try:
        st_dir = os.fstat(fd)
        rfd = os.open("report.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return False
    try:
        st_rep = os.fstat(rfd)
    finally:
        os.close(rfd)
    if not stat.S_ISDIR(st_dir.st_mode) or not stat.S_ISREG(st_rep.st_mode):
        return False
    if st_rep.st_mode & stat.S_IROTH and st_dir.st_mode & stat.S_IXOTH:
        return True  # shared on purpose
    return viewer is not None and viewer == server_uid and st_dir.st_uid == server_uid == st_rep.st_uid


@contextlib.contextmanager
def opened_run(logdir: Path, name: str, viewer: int | None) -> Iterator[Path | None]:
    """The run ``name`` as a path through its open descriptor (/proc/self/fd/N) when ``viewer`` may see it, else
    None: the check and every read are of the same folder, whatever is renamed or linked meanwhile."""
    fd = open_inside(logdir, name)
    try:
        yield Path(f"/proc/self/fd/{fd}") if fd is not None and visible_fd(fd, viewer) else None
    finally:
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def opened_subdir(folder: Path, name: str) -> Iterator[Path | None]:
    """``folder/name`` opened once as a real folder (O_NOFOLLOW), as a /proc/self/fd path; None for anything else."""
    try:
        fd = os.open(folder / name, _DIR_FLAGS)
    except OSError:
        yield None
        return
    try:
        yield Path(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_file(folder: Path, name: str) -> Iterator[Path | None]:
    """``folder/name`` opened once with O_NOFOLLOW (a regular file only), as a /proc/self/fd path for the readers
    that take a path; None for anything else."""
    try:
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        yield Path(f"/proc/self/fd/{fd}") if stat.S_ISREG(os.fstat(fd).st_mode) else None
    finally:
        os.close(fd)


def visible(run: Path, logdir: Path, viewer: int | None, server_uid: int | None = None) -> bool:
    """May ``viewer`` (a uid, or None for unknown) see this run? (the module's rule)"""
    server_uid = os.geteuid() if server_uid is None else server_uid
    try:
        st_dir = os.lstat(run)
    except OSError:
        return False
    st_rep = regular_inside(run / "report.json", logdir)
    if st_rep is None or not stat.S_ISDIR(st_dir.st_mode):
        return False
    if st_rep.st_mode & stat.S_IROTH and st_dir.st_mode & stat.S_IXOTH:
        return True  # shared on purpose
    return viewer is not None and viewer == server_uid and st_dir.st_uid == server_uid == st_rep.st_uid

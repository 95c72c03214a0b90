"""Who may see which run in the TensorBoard tab (docs/trust.md, "The TensorBoard tab").

TensorBoard serves whoever reaches its port, but a run directory is private (0700/0600): so the tab shows a
private run only to a request from the user who started TensorBoard (on loopback the kernel says whose socket
asks: /proc/net/tcp), and a run made readable by everyone (``chmod -R a+rX RUN``) to anyone. Runs of other users
are shown only when they made them readable by everyone. Only real folders and regular files inside the log dir
are served, never a link out of it."""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN = "0A"


def peer_uid(environ: Mapping[str, Any]) -> int | None:
    """The uid owning the client socket of this request, when it comes over loopback; None when unknown (another
    host, or no /proc): such a request sees only runs readable by everyone."""
    try:
        addr = ipaddress.ip_address(str(environ.get("REMOTE_ADDR", "")))
        client_port = int(environ.get("REMOTE_PORT") or 0)
        server_port = int(environ.get("SERVER_PORT") or 0)
    except ValueError:
        return None
    mapped = getattr(addr, "ipv4_mapped", None)
    if not (addr.is_loopback or (mapped is not None and mapped.is_loopback)) or not client_port or not server_port:
        return None
    want_local, want_remote = f":{client_port:04X}", f":{server_port:04X}"
    for table in _TCP_TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    # local_address rem_address st ... uid: the client's own socket has our port as its peer.
                    if len(f) > 7 and f[1].endswith(want_local) and f[2].endswith(want_remote) and f[3] != _LISTEN:
                        return int(f[7])
        except OSError:
            continue
    return None


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

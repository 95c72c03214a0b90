"""Why a rendezvous failed: a TCP connection attempt to MASTER_ADDR:MASTER_PORT, classified by how it failed.

    address   the name does not resolve (DNS) or the host/network is unreachable
    port      the host answered but refused the connection: nothing listens on that port (yet)
    firewall  no answer before the timeout: a packet filter drops the SYN (or the host is down)
    peers     the connection works: the store is up, so some ranks did not arrive in time"""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass
from typing import TypedDict

_UNREACHABLE = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EADDRNOTAVAIL, errno.ENETDOWN, errno.EHOSTDOWN}
_REFUSED = {errno.ECONNREFUSED, errno.ECONNRESET}


class ProbeJson(TypedDict):
    """ProbeResult as the rendezvous check's evidence holds it (the fields in their order)."""

    host: str
    port: int
    cause: str
    detail: str
    seconds: float
    resolved: str | None


@dataclass(frozen=True)
class ProbeResult:
    host: str
    port: int
    cause: str  # "address", "port", "firewall", "peers" (connected), or "unknown"
    detail: str
    seconds: float
    resolved: str | None = None

    def to_json(self) -> ProbeJson:
        return ProbeJson(host=self.host, port=self.port, cause=self.cause, detail=self.detail, seconds=self.seconds,
                         resolved=self.resolved)


def classify(exc: BaseException | None) -> tuple[str, str]:
    """(cause, detail) for the outcome of a connect(): None means it connected."""
    if exc is None:
        return "peers", "TCP connection succeeded: the rendezvous store is reachable"
    if isinstance(exc, socket.gaierror):
        return "address", f"name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, TimeoutError):  # socket.timeout is an alias since 3.10
        return "firewall", "no answer before the timeout (packets dropped: firewall, security group, or host down)"
    if isinstance(exc, OSError) and exc.errno in _REFUSED:
        return "port", "connection refused: the host is up but nothing listens on the port"
    if isinstance(exc, OSError) and exc.errno in _UNREACHABLE:
        return "address", f"host or network unreachable ({exc.strerror})"
    return "unknown", f"{type(exc).__name__}: {exc}"


def probe_tcp(host: str, port: int, timeout: float = 3.0) -> ProbeResult:
    """Try one TCP connection and say what its outcome points at."""
    started = time.monotonic()
    resolved: str | None = None
    error: BaseException | None = None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        resolved = str(addr[0])
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(addr)
    except (OSError, ValueError) as exc:
        error = exc
    cause, detail = classify(error)
    return ProbeResult(host=host, port=port, cause=cause, detail=detail,
                       seconds=round(time.monotonic() - started, 3), resolved=resolved)

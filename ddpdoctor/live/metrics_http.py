"""The HTTP server of the Prometheus endpoint (--metrics-addr): one thread for every connection, bounded, and only
requests whose Host header names this server (docs/trust.md, "What listens").

prometheus_client's own server starts a thread per connection: 1,000 idle connections made 234 threads. Here one
selector thread serves them all; at most MAX_CONNECTIONS are kept (the oldest is dropped), a connection that has
not sent its request within IDLE_S is closed, a request is at most MAX_REQUEST bytes. A Host header that names
another host (a web page's DNS rebinding to 127.0.0.1) gets 421 and no figures."""

from __future__ import annotations

import ipaddress
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_CONNECTIONS = 64
IDLE_S = 10.0
MAX_REQUEST = 8192


@dataclass
class _Conn:
    sock: socket.socket
    opened: float
    inbox: bytes = b""
    outbox: bytes = field(default=b"")


def allowed_hosts(host: str, port: int) -> set[str]:
    """The Host header values (lower case) that name this server: its address, and for a loopback or wildcard
    address the names of this machine; each with and without the port."""
    names = {host.lower()}
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is None or ip.is_loopback:
        names |= {"localhost", "127.0.0.1", "::1"}
    if ip is not None and ip.is_unspecified:
        names |= {"localhost", "127.0.0.1", "::1", socket.gethostname().lower(), socket.getfqdn().lower()}
        try:
            names |= {str(a[4][0]) for a in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:
            pass
    out = set()
    for n in names:
        shown = f"[{n}]" if ":" in n else n
        out |= {shown, f"{shown}:{port}"}
    return out


class MetricsServer:
    """GET /metrics (and /) answered with ``render()`` by one thread; everything else 404/405/421/400."""

    def __init__(self, host: str, port: int, render: Callable[[], tuple[bytes, str]]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.port = int(self._listener.getsockname()[1])
        self.hosts = allowed_hosts(host, self.port)
        self.render = render
        self.rejected = 0
        self._conns: dict[int, _Conn] = {}  # insertion order = age: the first is the oldest
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ddpdoctor-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for fd in list(self._conns):
            self._drop(fd)
        self._sel.close()
        self._listener.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for key, events in self._sel.select(timeout=0.2):
                if key.fileobj is self._listener:
                    self._accept()
                    continue
                conn = self._conns.get(key.fd)
                if conn is None or conn.sock is not key.fileobj:
                    continue  # dropped earlier in this batch (an accept burst made room), its fd maybe reused
                if events & selectors.EVENT_READ:
                    self._read(key.fd)
                elif events & selectors.EVENT_WRITE:
                    self._write(key.fd)
            now = time.monotonic()
            for fd, conn in list(self._conns.items()):
                if now - conn.opened > IDLE_S:
                    self._drop(fd)
                else:
                    break  # in age order: the rest are younger

    def _accept(self) -> None:
        for _ in range(256):  # a burst of connections, without starving the ones already open
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: drop the oldest to make room
                if self._conns:
                    self._drop(next(iter(self._conns)))
                return
            sock.setblocking(False)
            while len(self._conns) >= MAX_CONNECTIONS:
                self._drop(next(iter(self._conns)))
            self._conns[sock.fileno()] = _Conn(sock, time.monotonic())
            self._sel.register(sock, selectors.EVENT_READ)

    def _drop(self, fd: int) -> None:
        conn = self._conns.pop(fd, None)
        if conn is None:
            return
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, fd: int) -> None:
        conn = self._conns[fd]
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(fd)
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbox) > MAX_REQUEST:
                self._answer(fd, 431, b"request header too large\n")
            return
        self._answer(fd, *self._respond(conn.inbox[:end]))

    def _respond(self, head: bytes) -> tuple[int, bytes, str]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, b"bad request\n", "text/plain"
        method, target = parts[0], parts[1]
        hosts = [ln.split(":", 1)[1].strip().lower() for ln in lines[1:] if ln.lower().startswith("host:")]
        if len(hosts) != 1 or hosts[0] not in self.hosts:
            self.rejected += 1
            return 421, b"this server does not serve that Host\n", "text/plain"
        if method not in ("GET", "HEAD"):
            return 405, b"only GET\n", "text/plain"
        if target.split("?", 1)[0] not in ("/metrics", "/"):
            return 404, b"not found: try /metrics\n", "text/plain"
        try:
            body, ctype = self.render()
        except Exception:  # noqa: BLE001 - a figure that cannot be shown must not stop the server
            return 500, b"figures unavailable\n", "text/plain"
        return 200, (b"" if method == "HEAD" else body), ctype

    def _answer(self, fd: int, code: int, body: bytes, ctype: str = "text/plain") -> None:
        conn = self._conns[fd]
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  421: "Misdirected Request", 431: "Request Header Fields Too Large",
                  500: "Internal Server Error"}[code]
        conn.outbox = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                       "Connection: close\r\n\r\n").encode("latin-1") + body
        conn.opened = time.monotonic()  # the answer gets its own IDLE_S to leave
        self._conns[fd] = self._conns.pop(fd)  # now the youngest
        self._sel.modify(conn.sock, selectors.EVENT_WRITE)
        self._write(fd)

    def _write(self, fd: int) -> None:
        conn = self._conns.get(fd)
        if conn is None:
            return
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(fd)
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._drop(fd)

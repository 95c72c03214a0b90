"""The monitor's listener: one event loop on loopback, authenticated by a per-job token, bounded in every size.

Every connection must send, as its first line (at most HELLO_MAX bytes, within AUTH_TIMEOUT_S), a JSON
``hello`` carrying the job's token; anything else is dropped at once and counted in ``rejected``. Ranks get
the token through their environment only (TOKEN_ENV), never on a command line or in a file. One thread
serves every connection (selectors); unauthenticated connections are capped (the oldest is dropped), lines
are capped, and the listener never trusts a message for anything but the sending rank's own state."""

from __future__ import annotations

import hmac
import json
import selectors
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from ddpdoctor.rundir.records import RankMessage

TOKEN_ENV = "DDPDOCTOR_MONITOR_TOKEN"
HELLO_MAX = 4096  # bytes of the first line of a connection
LINE_MAX = 16 << 20  # bytes of one authenticated message (a stack dump with its Flight Recorder entries)
AUTH_TIMEOUT_S = 5.0
MAX_PENDING = 16  # unauthenticated connections at once; the oldest goes when another arrives
RECV_BYTES = 1 << 16

# on_hello(msg) -> (rank, None) to accept, (None, reason) to refuse.
HelloCheck = Callable[[RankMessage], tuple[int | None, str | None]]
MessageHandler = Callable[[int, RankMessage], None]
CloseHandler = Callable[[int], None]


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    rank: int | None = None  # set once authenticated
    inbuf: bytearray = field(default_factory=bytearray)
    outbuf: bytearray = field(default_factory=bytearray)


class Listener:
    """Serves the ranks' connections on one thread; ``send(rank, line)`` is safe from any thread."""

    def __init__(self, token: str, on_hello: HelloCheck, on_message: MessageHandler, on_close: CloseHandler,
                 max_ranks: int = 4096) -> None:
        self.token = token.encode()
        self.on_hello = on_hello
        self.on_message = on_message
        self.on_close = on_close
        self.max_ranks = max_ranks
        self.rejected: Counter[str] = Counter()  # why connections or lines were dropped
        self._sel = selectors.DefaultSelector()
        self._server: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._conns: dict[socket.socket, _Conn] = {}
        self._by_rank: dict[int, _Conn] = {}
        self._lock = threading.Lock()  # guards outbufs and _by_rank against send() from other threads
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1") -> tuple[str, int]:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((host, 0))  # loopback only: no one off this host can even connect
        srv.listen(128)
        srv.setblocking(False)
        self._server = srv
        self._wake_r.setblocking(False)
        self._sel.register(srv, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="ddpdoctor-monitor", daemon=True)
        self._thread.start()
        return host, srv.getsockname()[1]

    def close(self) -> None:
        self._stopped.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def connected(self, rank: int) -> bool:
        with self._lock:
            return rank in self._by_rank

    def send(self, rank: int, line: bytes) -> bool:
        """Queue one line for ``rank``'s connection; False when the rank is not connected."""
        with self._lock:
            conn = self._by_rank.get(rank)
            if conn is None:
                return False
            conn.outbuf += line if line.endswith(b"\n") else line + b"\n"
        self._wake()
        return True

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # -- the loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stopped.is_set():
                self._update_write_interest()
                for key, events in self._sel.select(timeout=0.5):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except OSError:
                            pass
                    else:
                        conn: _Conn = key.data
                        try:
                            if events & selectors.EVENT_READ:
                                self._read(conn)
                            if events & selectors.EVENT_WRITE and conn.sock in self._conns:
                                self._write(conn)
                        except Exception:  # noqa: BLE001 - one bad connection never stops the monitor
                            self._drop(conn, "error")
                self._expire_pending()
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn, None)
            for s in (self._server, self._wake_r, self._wake_w):
                if s is not None:
                    s.close()
            self._sel.close()

    def _accept(self) -> None:
        assert self._server is not None
        for _ in range(64):
            try:
                sock, _ = self._server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.rejected["accept-error"] += 1
                return
            pending = [c for c in self._conns.values() if c.rank is None]
            if len(pending) >= MAX_PENDING:
                self._drop(min(pending, key=lambda c: c.opened), "too-many-connections")
            if len(self._conns) >= self.max_ranks + MAX_PENDING:
                self.rejected["too-many-connections"] += 1
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(sock, time.monotonic())
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn, None if conn.rank is not None else "closed-before-hello")
            return
        conn.inbuf += data
        while conn.sock in self._conns:
            nl = conn.inbuf.find(b"\n")
            limit = HELLO_MAX if conn.rank is None else LINE_MAX
            if nl < 0:
                if len(conn.inbuf) > limit:
                    self._drop(conn, "line-too-long")
                return
            if nl > limit:
                self._drop(conn, "line-too-long")
                return
            line = bytes(conn.inbuf[:nl])
            del conn.inbuf[:nl + 1]
            self._line(conn, line)

    def _line(self, conn: _Conn, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if conn.rank is None:
            self._authenticate(conn, msg)
            return
        if not isinstance(msg, dict):
            self.rejected["bad-message"] += 1  # from the job itself: ignore the line, keep the rank
            return
        # Raw JSON from the rank's socket, typed as the lines a rank sends: the monitor checks each value it acts on.
        self.on_message(conn.rank, cast(RankMessage, msg))

    def _authenticate(self, conn: _Conn, msg: Any) -> None:
        if not isinstance(msg, dict) or msg.get("type") != "hello":
            self._drop(conn, "not-hello")
            return
        token = msg.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self.token):
            self._drop(conn, "bad-token")
            return
        rank, reason = self.on_hello(cast(RankMessage, msg))
        if rank is None:
            self._drop(conn, reason or "bad-hello")
            return
        with self._lock:
            old = self._by_rank.get(rank)
            conn.rank = rank
            self._by_rank[rank] = conn
        if old is not None and old is not conn:
            old.rank = None  # a reconnect of the same rank replaces its old connection
            self._drop(old, None)

    def _write(self, conn: _Conn) -> None:
        with self._lock:
            data = bytes(conn.outbuf)
        if not data:
            return
        try:
            n = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn, None)
            return
        with self._lock:
            del conn.outbuf[:n]

    def _update_write_interest(self) -> None:
        with self._lock:
            wanting = [(c, bool(c.outbuf)) for c in self._conns.values() if c.rank is not None]
        for conn, want in wanting:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
            try:
                if self._sel.get_key(conn.sock).events != events:
                    self._sel.modify(conn.sock, events, conn)
            except (KeyError, ValueError):
                pass

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns.values() if c.rank is None and now - c.opened > AUTH_TIMEOUT_S]:
            self._drop(conn, "auth-timeout")

    def _drop(self, conn: _Conn, reason: str | None) -> None:
        if reason is not None:
            self.rejected[reason] += 1
        if self._conns.pop(conn.sock, None) is None:
            return
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        rank = conn.rank
        if rank is not None:
            with self._lock:
                if self._by_rank.get(rank) is conn:
                    del self._by_rank[rank]
                else:
                    rank = None
        if rank is not None:
            self.on_close(rank)

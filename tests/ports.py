"""Ports for tests that cannot collide (issue 26, item 14): a port is reserved by binding it, not guessed.

``reserve_port`` binds a port (the kernel's choice, or the one asked for), connects to it and closes the accepted
side first, which leaves the port in TIME_WAIT for a minute: no other process can bind it (a plain bind() fails
with EADDRINUSE and bind(0) never hands it out), while the server the test starts on it can, because torch's
TCPStore, like every server ddpdoctor starts, binds with SO_REUSEADDR. The same trick as Yelp's
ephemeral-port-reserve. A port picked by `bind(0)` and closed, or a random number tried once, is free only until
someone else (8 suites on one host) takes it."""

from __future__ import annotations

import contextlib
import socket


def reserve_port(host: str = "127.0.0.1", port: int = 0) -> int:
    """Reserve ``port`` (0: one the kernel picks) on ``host``; OSError when it is taken."""
    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(socket.socket())
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if port:
            # Asked for one port: it must be free of any listener and of any connection (SO_REUSEADDR above
            # would let us bind next to a TIME_WAIT of someone else's reservation).
            with socket.socket() as probe:
                probe.bind((host, port))
        srv.bind((host, port))
        srv.listen(1)
        addr = srv.getsockname()
        client = stack.enter_context(socket.socket())
        client.connect(addr)
        accepted, _ = srv.accept()
        stack.enter_context(accepted)  # closed first (stacks unwind in reverse): its side keeps TIME_WAIT
        return int(addr[1])
    raise AssertionError("unreachable")


def reserve_port_pair(host: str = "127.0.0.1") -> int:
    """P and P+1 both reserved (torchrun's store on P, ddpdoctor's job store on P+1)."""
    for _ in range(100):
        p = reserve_port(host)
        try:
            reserve_port(host, p + 1)
            return p
        except OSError:
            continue
    raise RuntimeError("no reservable port pair")

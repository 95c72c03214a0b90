"""The TensorBoard tab's peer identity (ddpdoctor/tensorboard_plugin/access.py, issue 40 item 3): the client's socket
is found by its full address, never by ports alone; and a run is read through the handle that was checked."""

from __future__ import annotations

import ipaddress
import os
import socket

from ddpdoctor.tensorboard_plugin import access

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(local: str, remote: str, uid: int, st: str = "01") -> str:
    return f"   0: {local} {remote} {st} 00000000:00000000 00:00000000 00000000 {uid:>6} 0 1234 1 0 20 4 30 10 -1\n"


def test_a_client_with_the_servers_port_number_is_found_by_its_address() -> None:
    # Server 127.0.0.1:8080 (0x1F90), the attacker's client bound to 127.0.0.2:8080. The server's own accepted
    # socket (root's) has the same two port numbers; only the addresses tell the rows apart.
    table = [HEADER,
             _row("0100007F:1F90", "00000000:0000", 0, st="0A"),  # the listener
             _row("0100007F:1F90", "0200007F:1F90", 0),  # the server's end
             _row("0200007F:1F90", "0100007F:1F90", 65534)]  # the client's end
    client = ipaddress.ip_address("127.0.0.2")
    assert access.socket_owners(table, client, 8080, 8080) == [65534]
    assert access.socket_owners(table, ipaddress.ip_address("127.0.0.3"), 8080, 8080) == []


def test_ipv6_table_and_mapped_addresses() -> None:
    mapped = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1 in the kernel's words
    table = [HEADER, _row(f"{mapped}:A000", f"{mapped}:1F90", 1000)]
    assert access.socket_owners(table, ipaddress.ip_address("127.0.0.1"), 0xA000, 8080) == [1000]


def test_a_real_loopback_client_is_this_user() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with socket.socket() as cli:
            cli.bind(("127.0.0.2", port))  # the server's port number on another loopback address
            cli.connect(("127.0.0.1", port))
            conn, (addr, cport) = srv.accept()
            with conn:
                env = {"REMOTE_ADDR": addr, "REMOTE_PORT": str(cport), "SERVER_PORT": str(port)}
                assert access.peer_uid(env) == os.geteuid()
                env["REMOTE_ADDR"] = "127.0.0.9"  # no such client socket: unknown, never the server's own
                assert access.peer_uid(env) is None

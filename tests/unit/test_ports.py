"""Tests choose ports that cannot collide (issue 26, item 14): tests/ports.py reserves a port, and no test picks
one by binding and releasing it or by guessing a number."""

from __future__ import annotations

import datetime
import re
import socket
from pathlib import Path

import pytest

from tests.ports import reserve_port, reserve_port_pair

TESTS = Path(__file__).resolve().parents[1]


def test_a_reserved_port_cannot_be_taken_by_anyone_else():
    port = reserve_port()
    with socket.socket() as other, pytest.raises(OSError):
        other.bind(("127.0.0.1", port))  # another suite's server, or a guessed port
    handed = set()
    for _ in range(300):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            handed.add(s.getsockname()[1])
    assert port not in handed  # the kernel never hands it out


def test_a_bound_and_released_port_could_be_taken():
    """Why the old helpers were wrong: once released, the port is anyone's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))


def test_torch_store_binds_a_reserved_pair():
    import torch.distributed as dist

    p = reserve_port_pair()
    stores = [dist.TCPStore("127.0.0.1", q, 1, True, timeout=datetime.timedelta(seconds=10)) for q in (p, p + 1)]
    stores[0].set("k", "v")
    assert stores[0].get("k") == b"v"


# Patterns of a port picked without reserving it: bound to 0 then released, a number guessed from random or a pid.
_UNRESERVED = [re.compile(p) for p in (
    r"return\s+(int\()?s\.getsockname\(\)\[1\]", r"randint\(\s*[12]\d{4}", r"getpid\(\)\s*%\s*\d+")]
# A test may use any port inside network namespaces it made itself (nothing else can bind there).
_PRIVATE_NAMESPACE = "network namespaces of their own"


def test_no_test_picks_an_unreserved_port():
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name in ("ports.py", "test_ports.py") or "seeds" in path.parts:
            continue
        lines = path.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if any(p.search(line) for p in _UNRESERVED) and not any(
                    _PRIVATE_NAMESPACE in ln for ln in lines[max(0, i - 3):i]):
                offenders.append(f"{path.relative_to(TESTS)}:{i + 1}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

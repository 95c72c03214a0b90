"""The monitor's listener (launch/transport.py) with real sockets: only token holders are heard, every size is
capped, one thread serves every connection, and a message never names a process or a file the monitor acts on."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ddpdoctor.launch.launcher import LaunchSpec
from ddpdoctor.launch.monitor import HangMonitor
from ddpdoctor.launch.transport import HELLO_MAX, MAX_PENDING
from ddpdoctor.rundir.layout import RunDir


def started(tmp_path: Path, nproc: int = 2) -> tuple[HangMonitor, tuple[str, int]]:
    script = tmp_path / "s.py"
    script.write_text("")
    spec = LaunchSpec("run", str(script), [], RunDir(tmp_path / "run"), torchrun={"--nproc-per-node": str(nproc)})
    mon = HangMonitor(hang_timeout=3.0)
    host, _, port = mon.start(spec).rpartition(":")  # type: ignore[union-attr]
    return mon, (host, int(port))


def connect(addr: tuple[str, int], *lines: Any) -> socket.socket:
    s = socket.create_connection(addr, timeout=5)
    for line in lines:
        s.sendall(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n")
    return s


def closed_by_peer(s: socket.socket, within: float = 3.0) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def wait_for(cond: Any, within: float = 3.0) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def hello(mon: HangMonitor, rank: int = 0, **kw: Any) -> dict[str, Any]:
    return {"type": "hello", "token": mon.token, "rank": rank, "pid": 4242, "world_size": 2, **kw}


def test_a_rank_with_the_token_is_heard_and_can_be_asked(tmp_path: Path) -> None:
    mon, addr = started(tmp_path)
    try:
        s = connect(addr, hello(mon), {"type": "beat", "step": 3, "step_started": 1.0, "where": "x.py:1"})
        assert wait_for(lambda: (mon.links.get(0) and mon.links[0].beat or {}).get("step") == 3)
        assert mon.snapshot()[0]["connected"] is True
        assert mon.send(0, {"type": "dump"})
        s.settimeout(3)
        assert json.loads(s.recv(100)) == {"type": "dump"}
        s.close()
    finally:
        mon.stop(None)  # type: ignore[arg-type]


def test_anything_without_the_token_is_dropped_and_counted(tmp_path: Path) -> None:
    mon, addr = started(tmp_path)
    try:
        attacks = [
            hello(mon, token="0" * 64),                      # wrong token
            {"type": "beat", "step": 9},                     # no hello first
            b"\x1b]0;pwned\x07 not json\n",                   # junk
            hello(mon, world_size=10**12),                   # absurd world size (was a MemoryError)
            hello(mon, world_size=3),                        # not this launch's world size
            hello(mon, rank=7),                              # rank out of range
            hello(mon, rank="0"),                            # wrong type
            b"x" * (HELLO_MAX + 10),                         # an endless first line
        ]
        socks = [connect(addr, a) for a in attacks]
        assert all(closed_by_peer(s) for s in socks)
        assert mon.links == {}
        rejected = mon.listener.rejected  # type: ignore[union-attr]
        assert rejected["bad-token"] == 1 and rejected["not-hello"] == 2 and rejected["line-too-long"] == 1
        assert rejected["bad-world-size"] == 2 and rejected["bad-rank"] == 1 and rejected["bad-hello"] == 1
    finally:
        mon.stop(None)  # type: ignore[arg-type]
    saved = json.loads((tmp_path / "run" / "heartbeats.json").read_text())
    assert saved["monitor"]["rejected"]["bad-token"] == 1
    assert (tmp_path / "run" / "heartbeats.json").stat().st_mode & 0o077 == 0  # owner-only


def test_many_silent_connections_use_one_thread_and_do_not_lock_out_the_job(tmp_path: Path) -> None:
    before = threading.active_count()
    mon, addr = started(tmp_path)
    try:
        idle = [connect(addr) for _ in range(300)]
        time.sleep(0.5)
        assert threading.active_count() <= before + 1  # one loop thread, whatever the connection count
        rank = connect(addr, hello(mon, rank=1))  # the job still gets in
        assert wait_for(lambda: 1 in mon.links)
        assert mon.listener.rejected["too-many-connections"] >= 300 - MAX_PENDING  # type: ignore[union-attr]
        for s in idle + [rank]:
            s.close()
    finally:
        mon.stop(None)  # type: ignore[arg-type]


def test_a_message_never_picks_the_file_or_process_the_monitor_acts_on(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("do not read")
    mon, addr = started(tmp_path)
    try:
        victim_pid = 1  # init: never in ddpdoctor's own process tree
        s = connect(addr, hello(mon, pid=4242, stacks_file=str(secret)),
                    {"type": "beat", "step": 1, "step_started": 0.0, "pid": victim_pid})
        assert wait_for(lambda: 0 in mon.links and mon.links[0].beat is not None)
        mon.root_pid = 999_999_999  # a tree that holds neither PID
        stacks, _ = mon.collect(dict(mon.links))
        assert "do not read" not in json.dumps(stacks)
        s.close()
    finally:
        mon.stop(None)  # type: ignore[arg-type]

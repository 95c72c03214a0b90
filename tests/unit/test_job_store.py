"""The job store (ddpdoctor/job/store.py) on a real TCPStore on loopback: sealed values, junk and foreign clients."""

from __future__ import annotations

import datetime
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from ddpdoctor.job.role import job_role
from ddpdoctor.job.store import JobStore, JobStoreError, shared_token
from tests.ports import reserve_port


def free_port() -> int:
    return reserve_port()  # reserved until the store binds it (tests/ports.py)


@pytest.fixture
def head() -> JobStore:
    store = JobStore("127.0.0.1", free_port(), "t" * 32, is_head=True, connect_timeout_s=5)
    yield store
    store.close()


def test_round_trip_and_absent_keys(head: JobStore) -> None:
    node = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    _put(node, "node/1", {"v": 1, "ranks": [{"r": 2}]})
    assert head.get("node/1") == {"v": 1, "ranks": [{"r": 2}]}
    assert head.get("node/7") is None  # absent: no wait
    assert head.get_many(["node/0", "node/1"]) == {"node/1": {"v": 1, "ranks": [{"r": 2}]}}
    assert head.rejected == 0


def test_listens_on_the_master_address_only(head: JobStore) -> None:
    assert head.bound == ("127.0.0.1", head.port)


def test_other_token_is_rejected_and_counted(head: JobStore) -> None:
    intruder = JobStore("127.0.0.1", head.port, "x" * 32, is_head=False, connect_timeout_s=5)
    # It does not know the job's key names; even writing under them, its seal does not verify.
    assert intruder.key_of("verdict") != head.key_of("verdict")
    intruder.key_of = head.key_of  # type: ignore[method-assign]
    _put(intruder, "verdict", {"line": "forged"})
    assert head.get("verdict") is None and head.rejected == 1
    assert "failed their seal" in head.tampered()


def _raw(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=5))


def _set(raw: dist.TCPStore, key: str, value: bytes) -> None:
    """Set, then wait for the server to have it: TCPStore's SET gets no reply, so another client's next read can
    reach the server before it (the test failed once in CI that way). A CHECK on the same connection is answered
    only after the SET before it was applied."""
    raw.set(key, value)
    assert raw.check([key])


def _put(node: JobStore, name: str, obj: object) -> None:
    node.put(name, obj)
    assert node._store.check([node.key_of(name)])


def test_a_client_without_the_token_reads_nothing(head: JobStore) -> None:
    # Issue 40 item 1: TCPStore has no authentication and lists its keys. Whatever a foreign client lists and reads
    # carries neither the names nor the contents of what the job sent.
    secret = "Traceback: rank 3 stderr tail, secret-path /home/alice/data"
    node = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    _put(node, "files/1", {"3": {"stderr.log": secret * 20}})
    _put(node, "verdict", {"line": "job hung: culprit rank 3"})
    raw = _raw(head.port)
    keys = raw.list_keys()
    assert keys and not any("files" in k or "verdict" in k or "node" in k for k in keys)
    for k in keys:
        value = bytes(raw.get(k))
        assert b"secret-path" not in value and b"culprit" not in value and b"stderr" not in value
        import zlib
        for start in range(0, 64):  # not merely compressed: no offset inflates to the text
            try:
                assert b"secret" not in zlib.decompressobj().decompress(value[start:], 1 << 20)
            except zlib.error:
                pass
    assert head.get("files/1") == {"3": {"stderr.log": secret * 20}}


def test_moved_replayed_and_flipped_values_are_refused(head: JobStore) -> None:
    node = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    raw = _raw(head.port)
    _put(node, "node/1", {"step": 1})
    old = bytes(raw.get(head.key_of("node/1")))
    _put(node, "node/1", {"step": 2})
    assert head.get("node/1") == {"step": 2}
    _set(raw, head.key_of("node/1"), old)  # an attacker replays what it recorded: stale, refused
    assert head.get("node/1") is None and head.stale == 1 and "replays" in head.tampered()
    _set(raw, head.key_of("node/2"), old)  # the same sealed bytes under another name
    assert head.get("node/2") is None and head.rejected == 1
    flipped = bytearray(old)
    flipped[-1] ^= 1
    _set(raw, head.key_of("node/3"), bytes(flipped))
    assert head.get("node/3") is None and head.rejected == 2
    _put(node, "node/1", {"step": 3})
    assert head.get("node/1") == {"step": 3}


def test_junk_values_and_junk_connections_never_crash(head: JobStore) -> None:
    raw = dist.TCPStore("127.0.0.1", head.port, is_master=False, timeout=datetime.timedelta(seconds=5))
    for junk in (b"", b"x", b"\x00" * 40, os.urandom(5000)):
        _set(raw, head.key_of("node/0"), junk)
        assert head.get("node/0") is None
    for junk in (b"GET / HTTP/1.0\r\n\r\n", os.urandom(4096), b"\xff" * 64):
        with socket.create_connection(("127.0.0.1", head.port), timeout=2) as c:
            c.sendall(junk)
            time.sleep(0.05)
    head.put("node/0", {"ok": True})
    assert head.get("node/0") == {"ok": True}


def test_value_over_the_cap_is_rejected(head: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.job.store as store_mod

    head.put("big", {"x": "a" * 100_000})
    monkeypatch.setattr(store_mod, "MAX_VALUE", 1000)
    assert head.get("big") is None and head.rejected == 1


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(JobStoreError, match="job store at 127.0.0.1"):
            JobStore("127.0.0.1", s.getsockname()[1], "t" * 32, is_head=True, connect_timeout_s=2)


def test_shared_token_first_node_creates_it_private_the_others_read_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPDOCTOR_JOB_TOKEN", raising=False)
    a = shared_token(tmp_path, "127.0.0.1:29500/2/")
    b = shared_token(tmp_path, "127.0.0.1:29500/2/")
    assert a == b and len(a) == 32
    (path,) = tmp_path.glob(".job-token-*")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert shared_token(tmp_path, "127.0.0.1:29600/2/") != a  # another job never reuses it
    monkeypatch.setenv("DDPDOCTOR_JOB_TOKEN", "from-env")
    assert shared_token(tmp_path, "127.0.0.1:29500/2/") == "from-env"


def _plant_as_nobody(shared: Path, name: str, token: str) -> Path:
    """Another user (uid 65534, through setpriv) plants a token file in a shared, world-writable --out."""
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to act as another user")
    os.chmod(shared, 0o1777)  # like /tmp: anyone may create files
    path = shared / name
    code = f"import os; fd = os.open({str(path)!r}, os.O_WRONLY | os.O_CREAT, 0o600); os.write(fd, {token!r}.encode())"
    proc = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", sys.executable, "-c",
                           code], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"the sandbox refuses setpriv: {proc.stderr.strip()[-200:]}")
    assert path.stat().st_uid == 65534
    return path


def request_cleanup(path: Path) -> None:
    import atexit
    import shutil

    atexit.register(shutil.rmtree, path, True)


def test_a_token_file_another_user_planted_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 26 1(a): whoever planted it would know the token: read the store, forge the verdict. Refused, named.
    import tempfile

    monkeypatch.delenv("DDPDOCTOR_JOB_TOKEN", raising=False)
    shared = Path(tempfile.mkdtemp(prefix="ddpdoctor-shared-", dir="/tmp"))  # pytest's own folders are 0700
    request_cleanup(shared)
    key = "127.0.0.1:29500/2/"
    import hashlib

    name = f".job-token-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    planted = _plant_as_nobody(shared, name, "p" * 32)
    with pytest.raises(JobStoreError, match=r"not this user's private job token \(owner uid 65534"):
        shared_token(shared, key, wait_s=1)
    # A link to somebody's file is refused too; the environment's token is always the job's own.
    planted.rename(shared / "elsewhere")
    (shared / name).symlink_to(shared / "elsewhere")
    with pytest.raises(JobStoreError, match="symbolic link"):
        shared_token(shared, key, wait_s=1)
    monkeypatch.setenv("DDPDOCTOR_JOB_TOKEN", "e" * 32)
    assert shared_token(shared, key) == "e" * 32


def test_a_token_file_others_can_read_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDPDOCTOR_JOB_TOKEN", raising=False)
    key = "127.0.0.1:29500/2/"
    tok = shared_token(tmp_path, key)
    (path,) = tmp_path.glob(".job-token-*")
    os.chmod(path, 0o644)
    with pytest.raises(JobStoreError, match="mode 644"):
        shared_token(tmp_path, key, wait_s=1)
    os.chmod(path, 0o600)
    assert shared_token(tmp_path, key) == tok


def test_job_role_from_torchrun_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("NODE_RANK", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    assert job_role({"--nnodes": "1"}) is None and job_role({}) is None
    r = job_role({"--nnodes": "2", "--node-rank": "1", "--master-addr": "10.0.0.5", "--master-port": "29611"})
    assert r is not None and (r.nnodes, r.node_rank, r.master_addr, r.master_port, r.is_head) == (2, 1, "10.0.0.5", 29611, False)
    r = job_role({"--nnodes": "1:4", "--rdzv-endpoint": "head:29400", "--rdzv-id": "job42"})
    assert r is not None and (r.nnodes, r.master_addr, r.master_port, r.is_head, r.key) == (4, "head", 29400, True,
                                                                                           "head:29400/4/job42")
    monkeypatch.setenv("SLURM_NODEID", "3")
    r = job_role({"--nnodes": "4", "--rdzv-endpoint": "head"})
    assert r is not None and r.node_rank == 3 and r.master_port == 29500


class _QuietNode:
    """The NodePort bits a node's end needs: no ranks of its own."""

    hang_timeout = 4.0
    startup_timeout = 60.0
    stalls: dict[Any, Any] = {}

    def records(self, now: float, job_started: float, ended: bool = False) -> list[Any]:
        return []

    def rank_ids(self) -> list[int]:
        return []


@pytest.mark.parametrize("others_said", [True, False])
def test_a_removed_final_word_is_never_a_lost_head(head: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   others_said: bool) -> None:
    # Issue 40 item 1: deleting the head's final word made node 1 of a healthy job print "the head node was lost" and
    # exit 1. The head answered all along: the node says the word did not arrive and takes the job's code from every
    # node's own sealed record (0 here); when those are gone too, the job's end is unknown, said as such.
    import ddpdoctor.job.agent as agent_mod
    from ddpdoctor.job import state
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole

    monkeypatch.setenv("DDPDOCTOR_JOB_TOKEN", "t" * 32)
    monkeypatch.setattr(agent_mod, "END_WAIT_S", -28.5)  # the node waits 1.5 s for the word
    node = JobAgent(JobRole(2, 1, "127.0.0.1", head.port - 1), _QuietNode(), tmp_path)  # type: ignore[arg-type]
    node.store = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    if others_said:
        head.put("node/0", state.envelope(0, "h0", 5, [], end=0))
        node.store.put("node/1", state.envelope(1, "h1", 5, [], end=0))
    out = node._finish_node(0)
    assert "was lost" not in (out.line or "") and "final word did not arrive" in (out.line or "")
    assert node.head_lost is None
    if others_said:
        assert out.code == 0 and "exit code 0" in (out.line or "")
    else:
        assert out.code == 1 and "end is unknown" in (out.line or "")


class _Head(_QuietNode):
    """The NodePort bits the head's decision needs: what it says, and whether it acted (a hang verdict)."""

    on_hang = "kill"
    world_size = 2
    changes = 0

    def __init__(self) -> None:
        self.said: list[str] = []
        self.acted: list[str] = []

    def say(self, line: str) -> None:
        self.said.append(line)

    def act(self, hang: Any, line: str, extra_text: str = "") -> None:
        self.acted.append(line)


def _head_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, _Head]:
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole

    monkeypatch.setenv("DDPDOCTOR_JOB_TOKEN", "t" * 32)
    monitor = _Head()
    agent = JobAgent(JobRole(2, 0, "127.0.0.1", free_port() - 1), monitor, tmp_path)  # type: ignore[arg-type]
    return agent, monitor


@pytest.mark.parametrize("attack", ["delete", "junk"])
def test_a_deleted_or_damaged_node_record_is_unknown_never_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                attack: str) -> None:
    # Issue 40 item 1 (round 5): a client that reaches the store's port deleted node 1's record again and again; after
    # the hang timeout the head judged the node lost and, with --on-hang kill, would have stopped a healthy job. A
    # record gone or refused after the head read it is interference: the node is unknown, said once, not lost.
    from ddpdoctor.job import state

    agent, monitor = _head_agent(tmp_path, monkeypatch)
    head = agent.store
    node = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    head.put("node/0", state.envelope(0, "h0", 1, []))
    _put(node, "node/1", state.envelope(1, "h1", 1, []))
    agent.read_nodes()
    raw = _raw(head.port)
    if attack == "delete":
        raw.delete_key(head.key_of("node/1"))
    else:
        _set(raw, head.key_of("node/1"), b"\0" * 80)
    assert raw.check([head.key_of("node/0")])
    agent.nodes[1].received -= 100.0  # silent since, past the 4 s hang timeout
    agent.nodes[0].received = time.time() + 10
    head.put("node/0", state.envelope(0, "h0", 2, []))
    agent._read_at = 0.0
    agent._decide(time.time() - 2)  # (started 2 s ago: no start-up verdict on these rankless nodes)
    assert not agent.nodes[1].lost and agent.unknown_nodes() == [1]
    assert monitor.acted == []  # no hang verdict, nothing killed
    assert len(monitor.said) == 1 and "node 1 (h1)" in monitor.said[0] and "unknown" in monitor.said[0]
    # The node publishes again: known again.
    _put(node, "node/1", state.envelope(1, "h1", 2, []))
    agent.read_nodes()
    assert agent.unknown_nodes() == []


def test_a_node_record_that_stays_but_never_moves_is_still_lost(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from ddpdoctor.job import state

    agent, _ = _head_agent(tmp_path, monkeypatch)
    node = JobStore("127.0.0.1", agent.store.port, "t" * 32, is_head=False, connect_timeout_s=5)
    agent.store.put("node/0", state.envelope(0, "h0", 1, []))
    _put(node, "node/1", state.envelope(1, "h1", 1, []))
    agent.read_nodes()
    agent.nodes[1].received -= 100.0
    monkeypatch.setattr(agent, "_on_hang", lambda *a: None)
    agent._decide(time.time() - 2)
    assert agent.nodes[1].lost and agent.unknown_nodes() == []


def test_a_node_end_deleted_once_still_reaches_the_head(head: JobStore, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # One delete of a node's last record (its end) made the head wait and call the node lost; the node puts it back
    # about once a second while it waits for the head's final word.
    import threading

    import ddpdoctor.job.agent as agent_mod
    from ddpdoctor.job.agent import JobAgent
    from ddpdoctor.job.role import JobRole

    monkeypatch.setenv("DDPDOCTOR_JOB_TOKEN", "t" * 32)
    monkeypatch.setattr(agent_mod, "END_WAIT_S", -26.0)  # the node waits 4 s for the word
    node = JobAgent(JobRole(2, 1, "127.0.0.1", head.port - 1), _QuietNode(), tmp_path)  # type: ignore[arg-type]
    node.store = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    node.end = 0
    node.publish()
    raw = _raw(head.port)
    raw.delete_key(head.key_of("node/1"))
    assert not raw.check([head.key_of("node/1")])
    t = threading.Thread(target=node._finish_node, args=(0,))
    t.start()
    deadline = time.time() + 3.5
    got = None
    while got is None and time.time() < deadline:
        time.sleep(0.2)
        got = head.get("node/1")
    t.join()
    assert got is not None and got["end"] == 0


def test_the_head_says_a_deleted_end_is_unknown_not_a_dead_host(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import ddpdoctor.job.agent as agent_mod
    from ddpdoctor.job import state

    agent, _ = _head_agent(tmp_path, monkeypatch)
    monkeypatch.setattr(agent_mod, "END_WAIT_S", 1.0)
    monkeypatch.setattr(agent, "_wait_acks", lambda *a, **k: None)
    node = JobStore("127.0.0.1", agent.store.port, "t" * 32, is_head=False, connect_timeout_s=5)
    agent.store.put("node/0", state.envelope(0, "h0", 1, [], end=0))
    _put(node, "node/1", state.envelope(1, "h1", 1, []))
    agent.read_nodes()
    _raw(agent.store.port).delete_key(agent.store.key_of("node/1"))
    agent.nodes[1].received -= 100.0
    out = agent._finish_head(tmp_path, 0)
    assert "died" not in (out.line or "") and "end is unknown" in (out.line or "") and "node 1 (h1)" in out.line
    assert out.code == 1


def test_a_bell_wakes_its_waiter_the_moment_it_is_rung_and_never_times_out(head: JobStore) -> None:
    """Stop mode's bells (job/divergence_relay.py): a blocking pop on a connection of its own, woken by a push from
    any handle; a bell rung before the wait is kept for it. No timing asserted beyond 'it woke'."""
    import threading

    node = JobStore("127.0.0.1", head.port, "t" * 32, is_head=False, connect_timeout_s=5)
    bell = node.bell("fp-bell")
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.extend([bell.wait(), bell.wait()]), daemon=True)
    waiter.start()
    head.ring("fp-bell")
    head.ring("fp-bell")
    waiter.join(timeout=60)
    assert woke == [True, True] and not waiter.is_alive()
    node.put("node/1", {"v": 1})  # the node's own handle is not held up by its bell's connection
    assert head.get("node/1") == {"v": 1}
    assert bell.key == node.key_of("fp-bell") != "fp-bell"  # the queue's name is keyed, as every value's

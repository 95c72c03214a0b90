"""The TCP probe on real sockets, the checkpoint-dir check on real paths, and nvidia-smi row judgement."""

from __future__ import annotations

import errno
import socket
import time

import pytest

from ddpdoctor.commands.preflight import parse_size
from ddpdoctor.errors import BadInput
from ddpdoctor.preflight.local import checkpoint_dir, dist_env, judge_gpu
from ddpdoctor.preflight.netprobe import classify, probe_tcp
from tests.ports import reserve_port


def _closed_port() -> int:
    return reserve_port()  # nothing listens there, and nobody else can start to (tests/ports.py)


def test_probe_closed_port_is_port():
    assert probe_tcp("127.0.0.1", _closed_port(), timeout=2).cause == "port"


def test_probe_listening_port_is_peers():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        res = probe_tcp("127.0.0.1", s.getsockname()[1], timeout=2)
    assert res.cause == "peers" and res.resolved == "127.0.0.1"


def test_probe_unresolvable_name_is_address():
    res = probe_tcp("no-such-host.invalid", 29500, timeout=2)  # .invalid never resolves (RFC 2606)
    assert res.cause == "address" and res.resolved is None


def test_probe_dropped_syns_is_firewall():
    # Linux drops SYNs to a listener whose accept queue is full: no RST, no answer, just like a DROP rule.
    held: list[socket.socket] = []
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(0)
        for _ in range(4):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(srv.getsockname())
            except BlockingIOError:
                pass
            held.append(c)
        time.sleep(0.2)
        res = probe_tcp("127.0.0.1", srv.getsockname()[1], timeout=1.0)
    for c in held:
        c.close()
    assert res.cause == "firewall" and res.seconds >= 0.9


def test_classify_timeouts_and_unreachable():
    assert classify(TimeoutError())[0] == "firewall"
    assert classify(OSError(errno.EHOSTUNREACH, "No route to host"))[0] == "address"
    assert classify(OSError(errno.ECONNREFUSED, "Connection refused"))[0] == "port"
    assert classify(OSError(errno.EPERM, "x"))[0] == "unknown"


def test_checkpoint_dir_writable_and_cleaned_up(tmp_path):
    target = tmp_path / "a" / "b"
    res = checkpoint_dir(str(target), 0.0, rank=0)
    assert res["status"] == "pass"
    assert res["evidence"]["created_for_test"] == [str(tmp_path / "a"), str(target)]
    assert not (tmp_path / "a").exists()  # what the check created, it removed
    existing = tmp_path / "ckpt"
    existing.mkdir()
    assert checkpoint_dir(str(existing), 0.0, rank=1)["status"] == "pass"
    assert list(existing.iterdir()) == []


def test_checkpoint_dir_unwritable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    res = checkpoint_dir(str(blocker / "ckpt"), 0.0, rank=0)
    assert res["status"] == "fail" and "Not a directory" in res["summary"]
    assert checkpoint_dir("/proc/ddpdoctor-ckpt", 0.0, rank=0)["status"] == "fail"  # even root cannot mkdir in /proc


def test_checkpoint_dir_free_space(tmp_path):
    res = checkpoint_dir(str(tmp_path), 1e9, rank=0)  # an exabyte
    assert res["status"] == "fail" and "GB free <" in res["summary"]
    assert checkpoint_dir(None, 1.0, rank=0)["status"] == "skipped"


@pytest.mark.parametrize(("row", "status"), [
    (["GPU-1", "H100", "80000", "81559", "0", "0x0000000000000001", "35"], "pass"),  # idle bit only
    (["GPU-1", "H100", "80000", "81559", "2", "0x0000000000000000", "35"], "fail"),  # uncorrected ECC
    (["GPU-1", "H100", "80000", "81559", "[N/A]", "0x0000000000000040", "90"], "warn"),  # HW thermal slowdown
    (["GPU-1", "H100", "40000", "81559", "0", "0x0000000000000000", "35"], "warn"),  # memory held by someone else
])
def test_judge_gpu(row, status):
    assert judge_gpu(row)["status"] == status


def test_dist_env_prefixes():
    env = {"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "1", "TORCHELASTIC_ERROR_FILE": "/x", "PATH": "/bin"}
    assert dist_env(env) == {"NCCL_IB_HCA": "mlx5", "TORCH_NCCL_BLOCKING_WAIT": "1"}


def test_parse_size():
    assert parse_size("256M") == 256 << 20
    assert parse_size("64MB") == 64 << 20
    assert parse_size("1G") == 1 << 30
    assert parse_size("4096") == 4096
    for bad in ("12", "lots", "-1M"):
        with pytest.raises(BadInput):
            parse_size(bad)


def test_ib_ports_from_sysfs(tmp_path):
    from ddpdoctor.preflight.local import ib_ports, parse_ib_rate

    assert parse_ib_rate("400 Gb/sec (4X NDR)\n") == 400.0
    assert parse_ib_rate("junk") is None
    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")):
        port = tmp_path / dev / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    assert ib_ports(tmp_path) == [
        {"device": "mlx5_0", "port": "1", "active": True, "rate_gbit": 200.0},
        {"device": "mlx5_1", "port": "1", "active": False, "rate_gbit": 200.0},
    ]
    assert ib_ports(tmp_path / "absent") == []

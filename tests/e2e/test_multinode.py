"""Real multi-node launches on one machine (issue 14 item 5): 2 launchers `ddpdoctor run --nnodes 2 --node-rank i`
sharing one --out; the head names the culprit, every node prints the same verdict and exits with the job's code."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ddpdoctor.job.grouping import parse_ranges
from tests.conftest import REPO, SCENARIOS
from tests.ports import reserve_port_pair

pytestmark = pytest.mark.slow

HANG_TIMEOUT = 4.0


def _port() -> int:
    # torchrun's store on P, ddpdoctor's job store on P+1: both reserved (tests/ports.py), not guessed.
    return reserve_port_pair()


@dataclass(frozen=True)
class Netns:
    """Two network namespaces joined by a veth pair: node i runs in ``names[i]`` with address ``addrs[i]`` on
    interface ``ifnames[i]`` (nothing of one node's network is the other's: no shared loopback)."""

    names: tuple[str, str]
    addrs: tuple[str, str]
    ifnames: tuple[str, str]


_NS_COUNT = itertools.count()


@contextlib.contextmanager
def node_namespaces() -> Iterator[Netns | None]:
    """Each node its own network namespace where the sandbox allows (root and iproute2): a Netns, removed on
    exit; None (with the reason in ``netns_refused``) where it does not."""
    global netns_refused
    if os.geteuid() != 0 or not shutil.which("ip"):
        netns_refused = "needs root and iproute2 for network namespaces"
        yield None
        return
    # A name for interfaces in network namespaces of their own (not a port): unique per process and call.
    tag = f"{os.getpid() % 0xfff:03x}{next(_NS_COUNT) % 16:x}"
    pair = _netns_pair(tag)
    if pair is None:
        netns_refused = "the sandbox refuses network namespaces"
        yield None
        return
    sub = 10 + int(tag, 16) % 200
    try:
        yield Netns(pair, (f"10.77.{sub}.1", f"10.77.{sub}.2"), (f"v{tag}a", f"v{tag}b"))
    finally:
        _netns_del(*pair)


netns_refused = ""


def start_nodes(command: str, script: str, out: Path | list[Path], nnodes: int = 2, nproc: int = 1, *extra: str,
                env: dict[str, str] | None = None, netns: Netns | None = None) -> list[subprocess.Popen[str]]:
    """``out``: one run directory for every node (a shared filesystem), or one per node. ``netns``: each node in
    its own network namespace (2 nodes), the head's address as the master address."""
    # In network namespaces of their own no other process can hold a port: any will do.
    port = _port() if netns is None else random.randint(20000, 59000)
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    if not (env or {}).get("DDPDOCTOR_JOB_TOKEN"):
        full_env.pop("DDPDOCTOR_JOB_TOKEN", None)
    outs = out if isinstance(out, list) else [out] * nnodes
    procs = []
    for n in range(nnodes):
        master, node_env, prefix = "127.0.0.1", dict(full_env), []
        if netns is not None:
            master, prefix = netns.addrs[0], ["ip", "netns", "exec", netns.names[n]]
            node_env["GLOO_SOCKET_IFNAME"] = netns.ifnames[n]
        cmd = [*prefix, sys.executable, "-m", "ddpdoctor", command, "--nnodes", str(nnodes), "--node-rank", str(n),
               "--nproc-per-node", str(nproc), "--master-addr", master, "--master-port", str(port),
               "--out", str(outs[n]), *extra, str(SCENARIOS / script)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=node_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    return procs


def finish(procs: list[subprocess.Popen[str]], timeout: float = 400) -> list[tuple[int, str, str]]:
    out = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out.append((p.returncode, so, se))
    return out


def run_nodes(script: str, tmp_path: Path, nnodes: int = 2, nproc: int = 1, *extra: str,
              env: dict[str, str] | None = None, command: str = "run") -> tuple[list[tuple[int, str, str]], Path]:
    out = tmp_path / "job"
    procs = start_nodes(command, script, out, nnodes, nproc, "--hang-timeout", str(HANG_TIMEOUT),
                        "--startup-timeout", "300", *extra, env=env)
    return finish(procs), out


def verdict_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("ddpdoctor: job ")]


def test_rank_stalled_on_the_other_node_is_named_on_both_consoles(tmp_path: Path) -> None:
    # The issue's own case: rank 3 (node 1) stuck in data loading at step 6.
    results, out = run_nodes("mn_stall.py", tmp_path, 2, 2)
    for code, _, err in results:
        assert code == 1, err[-3000:]
        (line, *_) = verdict_lines(err)
        assert "culprit rank(s) 3:" in line and "rank(s) 3 are outside any collective" in line, err[-2000:]
    assert "the job's report is on the head node" in results[1][2]
    hang = json.loads((out / "hang.json").read_text())
    d = hang["diagnosis"]
    # Which ranks had passed the timeout when the head decided depends on when each entered step 6 (load);
    # the culprit does not.
    assert d["kind"] == "outside-collective" and d["culprit_ranks"] == [3]
    assert d["stalled_ranks"] and set(d["stalled_ranks"]) <= {0, 1, 2, 3}
    assert d["positions"]["3"]["call_site"].endswith("mn_stall.py:13")
    first, *rest = hang["classes"]  # the outlier first; the waiting ranks in one class or more (their stacks)
    assert (first["ranks"], first["nodes"]) == ("3", "1")
    assert sorted(r for c in rest for r in parse_ranges(c["ranks"])) == [0, 1, 2]
    assert hang["reported_after_s"] <= HANG_TIMEOUT + 5 + 12  # + the other node's stacks (py-spy) under load
    report = json.loads((out / "report.json").read_text())
    (f,) = [f for f in report["findings"] if f["id"] == "hang"]
    assert f["evidence"]["culprit_ranks"] == [3]
    assert sorted(int(r) for r in os.listdir(out / "ranks") for r in [r.removeprefix("rank")]) == [0, 1, 2, 3]


def test_rank_crashed_on_node_1_while_node_0_waits(tmp_path: Path) -> None:
    results, out = run_nodes("mn_crash.py", tmp_path)
    for code, _, err in results:
        assert code == 1, err[-3000:]
        (line, *_) = verdict_lines(err)
        assert "rank(s) 1 failed first: ValueError: corrupt sample in shard 17" in line, err[-2000:]
    report = json.loads((out / "report.json").read_text())
    crashed = [f for f in report["findings"] if f["id"] == "rank-crashed"]
    assert [f["ranks"] for f in crashed] == [[1]]


def test_collective_called_on_one_node_only(tmp_path: Path) -> None:
    results, out = run_nodes("mn_one_node_collective.py", tmp_path)
    lines = []
    for code, _, err in results:
        assert code == 1, err[-3000:]
        lines.append(verdict_lines(err)[0])
    assert lines[0].split("; report in")[0] in lines[1]  # one verdict
    hang = out / "hang.json"
    if hang.exists():  # the barrier waits: a mismatch (or rank 1 behind), culprit rank 1
        d = json.loads(hang.read_text())["diagnosis"]
        assert d["culprit_ranks"] == [1] and d["kind"] in ("mismatch", "seq-behind"), d
    else:  # gloo aborted the mismatched pair at once: the root cause is named
        assert "rank(s)" in lines[0] and "failed" in lines[0]


def test_node_launcher_killed_is_a_lost_node(tmp_path: Path) -> None:
    out = tmp_path / "job"
    procs = start_nodes("run", "mn_healthy_slow.py", out, 2, 1, "--hang-timeout", str(HANG_TIMEOUT), "--startup-timeout",
                        "300",
                        env={"MN_STEPS": "400", "MN_SLOW_S": "0", "MN_STEP_SLEEP_S": "0.1",
                             "MN_MARK": str(tmp_path / "training")})
    deadline = time.time() + 300
    mark = tmp_path / "training"
    while time.time() < deadline and not (Path(f"{mark}.0").exists() and Path(f"{mark}.1").exists()):
        time.sleep(0.3)
    procs[1].send_signal(signal.SIGKILL)
    (code, _, err), (code1, _, _) = finish(procs)
    assert code == 1, err[-3000:]
    assert code1 == -signal.SIGKILL
    (line, *_) = verdict_lines(err)
    assert "node 1" in line and "rank(s) 1 lost" in line, err[-2000:]


def test_healthy_job_with_slow_first_and_eval_steps_no_false_hang(tmp_path: Path) -> None:
    results, out = run_nodes("mn_healthy_slow.py", tmp_path, env={"MN_SLOW_S": str(HANG_TIMEOUT * 0.6)})
    for code, _, err in results:
        assert code == 0, err[-3000:]
    assert verdict_lines(results[0][2]) == ["ddpdoctor: job finished ok"]
    assert verdict_lines(results[1][2]) == ["ddpdoctor: job finished ok; the job's report is on the head node "
                                            f"({os.uname().nodename}) in {out}/report.json"]
    assert (out / "report.json").is_file()  # what the other node points to exists
    assert not (out / "hang.json").exists()


def test_profile_on_two_nodes_into_one_out_matches_analyze(tmp_path: Path) -> None:
    results, out = run_nodes("mn_healthy_slow.py", tmp_path, 2, 1, "--json", "--wait", "1", "--warmup", "1",
                             "--active", "2", command="profile", env={"MN_SLOW_S": "0", "MN_STEPS": "8"})
    (code0, so0, err0), (code1, _, err1) = results
    assert code0 == 0 and code1 == 0, err0[-2000:] + err1[-2000:]
    profiled = json.loads(so0)
    assert len(list(out.glob("traces/*.json*"))) == 2
    proc = subprocess.run([sys.executable, "-m", "ddpdoctor", "analyze", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    analyzed = json.loads(proc.stdout)
    assert sorted(f["id"] for f in profiled["findings"]) == sorted(f["id"] for f in analyzed["findings"])
    assert profiled.get("world_size", 2) == analyzed.get("world_size", 2)


def test_launcher_none_every_rank_its_own_launcher_one_verdict(tmp_path: Path) -> None:
    # srun-style: the scheduler starts one ddpdoctor per rank; rank 0's is the head.
    out, port = tmp_path / "job", _port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, PYTHONUNBUFFERED="1", RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), MN_STUCK_RANK="1")
        env.pop("DDPDOCTOR_JOB_TOKEN", None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", "run", "--launcher", "none", "--hang-timeout", str(HANG_TIMEOUT),
             "--startup-timeout", "300", "--out", str(out), str(SCENARIOS / "mn_stall.py")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for code, _, err in finish(procs):
        assert code == 1, err[-3000:]
        (line, *_) = verdict_lines(err)
        assert "culprit rank(s) 1:" in line, err[-2000:]
    d = json.loads((out / "hang.json").read_text())["diagnosis"]
    assert d["culprit_ranks"] == [1] and d["kind"] == "outside-collective"


def test_without_a_shared_filesystem_the_head_gathers_every_rank(tmp_path: Path) -> None:
    outs = [tmp_path / "n0", tmp_path / "n1"]
    procs = start_nodes("run", "mn_crash.py", outs, 2, 1, "--hang-timeout", str(HANG_TIMEOUT), "--startup-timeout",
                        "300", env={"DDPDOCTOR_JOB_TOKEN": "a-secret-every-node-has"})
    for code, _, err in finish(procs):
        assert code == 1, err[-3000:]
        assert "rank(s) 1 failed first: ValueError: corrupt sample in shard 17" in verdict_lines(err)[0]
    # Node 1's rank folder reached the head through the store: the head's report names its exception.
    status = json.loads((outs[0] / "ranks" / "rank1" / "status.json").read_text())
    assert "corrupt sample" in status["exception"]
    report = json.loads((outs[0] / "report.json").read_text())
    (crashed,) = [f for f in report["findings"] if f["id"] == "rank-crashed"]
    assert crashed["ranks"] == [1] and "corrupt sample" in crashed["evidence"]["exception"]
    assert not list(outs[0].glob(".job-token-*"))  # the token came from the environment


def _netns_pair(tag: str) -> tuple[str, str] | None:
    """Two network namespaces joined by a veth pair (10.77.x.1 and .2), or None where the sandbox refuses."""
    a, b = f"ddpd{tag}a", f"ddpd{tag}b"
    sub = 10 + int(tag, 16) % 200
    cmds = [
        ["ip", "netns", "add", a], ["ip", "netns", "add", b],
        ["ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b"],
        ["ip", "link", "set", f"v{tag}a", "netns", a], ["ip", "link", "set", f"v{tag}b", "netns", b],
        ["ip", "-n", a, "addr", "add", f"10.77.{sub}.1/24", "dev", f"v{tag}a"],
        ["ip", "-n", b, "addr", "add", f"10.77.{sub}.2/24", "dev", f"v{tag}b"],
        ["ip", "-n", a, "link", "set", f"v{tag}a", "up"], ["ip", "-n", b, "link", "set", f"v{tag}b", "up"],
        ["ip", "-n", a, "link", "set", "lo", "up"], ["ip", "-n", b, "link", "set", "lo", "up"],
    ]
    for cmd in cmds:
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            _netns_del(a, b)
            return None
    return a, b


def _netns_del(*names: str) -> None:
    for n in names:
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_nodes_in_their_own_network_namespaces(tmp_path: Path) -> None:
    # Each node has its own network stack and address: nothing may assume 127.0.0.1 across nodes.
    with node_namespaces() as ns:
        if ns is None:
            pytest.skip(netns_refused)
        out = tmp_path / "job"
        procs = start_nodes("run", "mn_stall.py", out, 2, 1, "--hang-timeout", str(HANG_TIMEOUT), "--startup-timeout",
                            "300", env={"MN_STUCK_RANK": "1"}, netns=ns)
        for code, _, err in finish(procs):
            assert code == 1, err[-3000:]
            assert "culprit rank(s) 1:" in verdict_lines(err)[0], err[-2000:]
    assert json.loads((out / "hang.json").read_text())["diagnosis"]["culprit_ranks"] == [1]

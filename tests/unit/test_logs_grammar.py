"""Unit fixtures written from docs/logs-grammar.md: every wording of every rule, per version, parses to its kind and
role; and small multi-rank logs built from those wordings give the right culprit and victims."""

from __future__ import annotations

import pytest

from ddpdoctor.logs.events import ChildFailure, FailureLine, Unexplained
from ddpdoctor.logs.explain import explain_texts
from ddpdoctor.logs.failures import parse_failure
from ddpdoctor.logs.lines import split_lines
from ddpdoctor.logs.messages import parse_line

# (line as printed, kind, role) — one row per wording and version in docs/logs-grammar.md.
WORDINGS = [
    # CUDA out of memory: 1.x RuntimeError, 2.0-2.4 torch.cuda.OutOfMemoryError, 2.5+ torch.OutOfMemoryError
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 3; 39.59 GiB total capacity; 36.1 GiB "
     "already allocated)", "oom", "cause"),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
     "79.15 GiB of which 1.2 GiB is free.", "oom", "cause"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 5 has a total capacity of "
     "79.33 GiB", "oom", "cause"),
    ("node3:2841:2901 [2] NCCL WARN Cuda failure 'out of memory'", "oom", "cause"),
    ("node3:2841:2901 [2] NCCL WARN Failed to CUDA calloc 6291456 bytes", "oom", "cause"),
    ("Cuda failure 'out of memory'", "oom", "cause"),
    # DDP construction-time model check
    ("RuntimeError: DDP expects same model across all ranks, but Rank 0 has 237 params, while rank 2 has "
     "inconsistent 236 params.", "model-mismatch", "cause"),
    ("RuntimeError: [1]: params[0] in this process with sizes [1024, 512] appears not to match sizes of the same "
     "param in process 0.", "model-mismatch", "cause"),
    # watchdog stuck / heartbeat monitor (2.2, 2.3-2.6, 2.3-2.13)
    ("[PG ID 0 PG GUID 0(default_pg) Rank 3] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making "
     "progress in monitoring enqueued collectives.", "watchdog-stuck", "cause"),
    ("[PG 0 Rank 1] Heartbeat monitor timed out! Process will be terminated after dumping debug info. "
     "workMetaList_.size()=2", "watchdog-stuck", "cause"),
    ("[Rank 0] NCCL monitor thread timeout. Basically, this could be due to CUDA or NCCL calls being unexpectedly "
     "blocking", "watchdog-stuck", "cause"),
    # torch's NCCL errors, NCCL 2.8-2.17 and 2.18+ wordings
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1191, unhandled cuda error, "
     "NCCL version 2.10.3", "nccl-error", "cause"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
     "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5", "nccl-error", "cause"),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", "nccl-error", "cause"),
    ("ncclInternalError: Internal check failed.", "nccl-error", "cause"),
    ("RuntimeError: NCCL error in: /opt/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:47, internal error, "
     "NCCL version 2.7.8", "nccl-error", "cause"),
    ("ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
     "nccl-error", "cause"),
    ("gpu-a:1234:1300 [0] NCCL WARN NET/IB : Got completion from peer 10.1.1.2<56473> with error 12, opcode 0, "
     "len 0, vendor err 129 (Send)", "nccl-error", "cause"),
    ("gpu-a:1234:1300 [0] NCCL WARN Call to ibv_reg_mr failed with error Cannot allocate memory", "nccl-error",
     "cause"),
    ("gpu-a:1234:1300 [0] NCCL WARN Error: failed to extend /dev/shm/nccl-7AqkMm to 9637892 bytes", "nccl-error",
     "cause"),
    ("gpu-a:1234:1300 [1] NCCL WARN Cuda failure 'an illegal memory access was encountered'", "nccl-error", "cause"),
    # NCCL: a peer went away (victim wordings)
    ("gpu-b:11:19 [3] NCCL WARN Net : Connection closed by remote peer 10.0.0.5<34567>", "nccl-remote", "victim"),
    ("gpu-b:11:19 [3] NCCL WARN socketProgress: Connection closed by remote peer gpu-a<45678>", "nccl-remote",
     "victim"),
    ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
     "remote process exited or there was a network error, NCCL version 2.19.3", "nccl-remote", "victim"),
    # TCPStore and rendezvous
    ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
     "store-cause", "cause"),
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. The "
     "server socket has failed to bind to [::]:29500 (errno: 98 - Address already in use).", "store-cause", "cause"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", "store-cause", "cause"),
    ("[E socket.cpp:...] recvValue failed on SocketImpl(fd=43, addr=[node1]:51234, remote=[node0]:29500): "
     "Connection reset by peer", "store", "victim"),
    ("RuntimeError: Broken pipe", "store", "victim"),
    ("torch.distributed.DistNetworkError: Connection reset by peer", "store", "victim"),
    ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
     "failed. See inner exception for details.", "store", "victim"),
    ("RuntimeError: The client socket has failed to connect to [node0]:29500 (errno: 111 - Connection refused).",
     "store", "victim"),
    # connecting happens at start-up: a connect timeout is a rendezvous never reached, not a store lost mid-job
    ("[E socket.cpp:860] [c10d] The client socket has timed out after 60s while trying to connect to 192.0.0.1:1234",
     "store-cause", "cause"),
    ("RuntimeError: connect() timed out. Original timeout was 60000 ms.", "store-cause", "cause"),
    # DeepSpeed's launcher, the proxy service thread at teardown, libfabric completion errors
    ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: Invalid address",
     "nccl-error", "cause"),
    ("libfabric:9:1700000000::cxi:core:cxip_cq_eq_progress():531<warn> TXC (0x1:0:0): Send error: RC_UNDELIVERABLE",
     "nccl-error", "cause"),
    ("[rank3]:[E ProcessGroupNCCL.cpp:1414] [PG 2 Rank 3] Process group watchdog thread terminated with exception: "
     "CUDA error: an illegal memory access was encountered", "cuda-error", "cause"),
    ("n176-080-198:2657296:2658232 [0] include/alloc.h:102 NCCL WARN Cuda failure 1 'invalid argument'", "nccl-error",
     "cause"),
    ("[1,23]<stdout>:ip-172-32-45-165:72593:73427 [7] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open "
     "AV. RC: -22, ERROR: Invalid argument", "nccl-error", "cause"),
    ("sendBytes failed on SocketImpl(fd=12, addr=[::ffff:10.0.0.2]:4021, remote=[::ffff:10.0.0.1]:29500): Broken "
     "pipe", "store", "victim"),
    # gloo
    ("terminate called after throwing an instance of 'gloo::IoException'", "gloo-io", "victim"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
     "[10.0.0.2]:6061", "gloo-io", "victim"),
    ("  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [127.0.0.1]:29787: Connection reset "
     "by peer", "gloo-io", "victim"),
]


def _one(text: str, rank: int | None = None):
    (line,) = split_lines("rank.log", text, default_rank=rank)
    return parse_failure(line)


@pytest.mark.parametrize(("text", "kind", "role"), WORDINGS, ids=[f"{w[1]}-{i}" for i, w in enumerate(WORDINGS)])
def test_every_wording_parses_to_its_kind(text: str, kind: str, role: str) -> None:
    event = _one(text)
    assert isinstance(event, FailureLine), event
    assert (event.kind, event.role) == (kind, role)


def test_nccl_line_carries_host_and_gpu() -> None:
    event = _one("node3:2841:2901 [2] NCCL WARN Failed to CUDA calloc 6291456 bytes")
    assert isinstance(event, FailureLine) and (event.host, event.gpu) == ("node3", 2)


@pytest.mark.parametrize("text", [
    "node1:1:1 [0] NCCL WARN Could not find real path of /sys/class/net/eth0/device",
    "node1:1:1 [0] NCCL WARN Cuda failure 'driver shutting down'",
    "node1:1:1 [0] NCCL WARN [Proxy Service] Failed to execute operation Close from rank 1, retcode 3",
    "node1:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so",
    "node1:1:1 [0] NCCL INFO Channel 00/02 : 0 1",
    "Epoch 3: 100%|##########| 50/50 [00:10<00:00, loss=0.12]",
    "WARNING:torch.distributed.run:Setting OMP_NUM_THREADS environment variable for each process to be 1",
    "[W socket.cpp:601] [c10d] The client socket has failed to connect to [node0]:29500 (errno: 111 - Connection "
    "refused).",
    "[rank0]:[W403 11:42:02.380967152 ProcessGroupNCCL.cpp:1250] Warning: WARNING: process group has NOT been destroyed "
    "before we destruct ProcessGroupNCCL.",
    "gpu1:5021:5386 [0] transport/net_ib.cc:93 NCCL WARN NET/IB : Got async event : client reregistration",
])
def test_healthy_and_benign_lines_are_not_failures(text: str) -> None:
    assert _one(text) is None


@pytest.mark.parametrize(("text", "rank", "signal", "exitcode"), [
    # the elastic agent: 1.9-2.0 logging prefix, 2.1 bracketed, 2.2+ glog
    ("ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 4 (pid: 18532) of "
     "binary: /usr/bin/python3", 4, "SIGKILL", -9),
    ("[2023-08-01 10:00:00,123] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -6) "
     "local_rank: 1 (pid: 77) of binary: /opt/conda/bin/python", 1, "SIGABRT", -6),
    ("E1122 10:23:15.599000 8860 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
     "local_rank: 0 (pid: 8861) of binary: /usr/bin/python", 0, None, 1),
])
def test_elastic_agent_failure_line(text: str, rank: int, signal: str | None, exitcode: int) -> None:
    event = _one(text)
    assert isinstance(event, ChildFailure)
    assert (event.rank, event.signal, event.exitcode, event.reporter) == (rank, signal, exitcode, "agent")


@pytest.mark.parametrize(("text", "signal"), [
    ("Killed", "SIGKILL"), ("bash: line 1: 4242 Killed                  python train.py", "SIGKILL"),
    ("Aborted (core dumped)", "SIGABRT"), ("Segmentation fault (core dumped)", "SIGSEGV"),
])
def test_shell_death_lines(text: str, signal: str) -> None:
    event = _one(text, rank=3)
    assert isinstance(event, ChildFailure) and (event.rank, event.signal) == (3, signal)


@pytest.mark.parametrize("text", [
    "[E ProcessGroupNCCL.cpp:414] Some NCCL operations have failed or timed out.",
    "ValueError: something unknown",
    "[F something.cpp:12] fatal thing",
    "exitcode: 3",
    "ERROR:root:could not save the checkpoint",
    "2024-05-01 10:00:00,000 - trainer - ERROR - loss is nan",
])
def test_generic_failure_lines_are_kept_as_unexplained(text: str) -> None:
    assert isinstance(_one(text), (Unexplained, FailureLine))


def test_watchdog_without_seqnum_is_parsed() -> None:
    (line,) = split_lines("x", "[E ProcessGroupNCCL.cpp:587] [Rank 2] Watchdog caught collective operation timeout: "
                               "WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for 1800523 milliseconds before "
                               "timing out.")
    (event,) = parse_line(line)
    assert (event.rank, event.seq, event.op, event.ran_for_ms) == (2, None, "BROADCAST", 1800523)


def test_glog_timestamps_order_lines() -> None:
    lines = split_lines("x", "[E1122 10:00:05.100 a.cpp:1] two\n[E1122 10:00:01.000 a.cpp:1] one\nplain\n"
                             "[2024-11-22 10:00:07,5] three")
    assert [ln.ts is not None for ln in lines] == [True, True, True, True]
    assert lines[1].ts < lines[0].ts and lines[2].ts == lines[1].ts and lines[3].ts > lines[0].ts


# --- scenarios: culprit and victims ------------------------------------------------------------------------------

def by_id(texts: dict[str, str]):
    out: dict[str, list] = {}
    for f in explain_texts(texts):
        out.setdefault(f.id, []).append(f)
    return out


def test_killed_rank_is_the_culprit_and_gloo_peers_are_victims() -> None:
    found = by_id({
        "rank0.log": "step 10\nterminate called after throwing an instance of 'gloo::IoException'\n"
                     "  what():  [../third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [10.0.0.2]:4242: "
                     "Connection reset by peer\nAborted (core dumped)\n",
        "rank1.log": "step 10\nKilled\n",
    })
    (crash,) = found["rank-crashed"]
    assert crash.ranks == [1] and "SIGKILL" in crash.title
    assert crash.evidence["victim_ranks"] == [0]
    assert "peer-lost" not in found


def test_old_agent_wording_sigkill_names_the_rank() -> None:
    found = by_id({"launcher.log": "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
                                   "local_rank: 4 (pid: 18532) of binary: /usr/bin/python3\n"})
    (crash,) = found["rank-crashed"]
    assert crash.ranks == [4] and "SIGKILL" in crash.title


def test_oom_on_one_rank_then_watchdog_timeouts_on_the_others() -> None:
    timeout = ("[rank{r}]:[E1122 10:30:0{r}.000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
               "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE, NumelIn=10, NumelOut=10, Timeout(ms)=600000)"
               " ran for 600050 milliseconds before timing out.\n")
    found = by_id({"job.log": (
        "[rank2]:[E1122 10:20:00.000 x.py:1] boom\n"
        "[rank2]: Traceback (most recent call last):\n"
        '[rank2]:   File "/job/train.py", line 88, in <module>\n'
        "[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 2 has a total "
        "capacity of 79.15 GiB\n" + "".join(timeout.format(r=r) for r in (0, 1, 3)))})
    (oom,) = found["oom"]
    assert oom.ranks == [2] and "4.00 GiB" in oom.title and oom.evidence["call_sites"] == {"2": "/job/train.py:88"}
    assert oom.evidence["victim_ranks"] == [0, 1, 3]
    assert "rank-crashed" not in found
    (hang,) = found["hang"]
    assert hang.evidence["culprit_ranks"] == [2]
    assert list(explain_texts({"job.log": ""})) == []


def test_model_mismatch_blames_the_rank_the_message_names() -> None:
    msg = ("[rank{me}]: RuntimeError: DDP expects same model across all ranks, but Rank {me} has 237 params, while "
           "rank {odd} has inconsistent 236 params.\n")
    text = "".join(msg.format(me=me, odd=2 if me != 2 else 0) for me in (0, 1, 2, 3))
    (f,) = by_id({"job.log": text})["model-mismatch"]
    assert f.ranks == [2] and f.evidence["culprit_ranks"] == [2]
    single = by_id({"job.log": msg.format(me=0, odd=3)})
    assert single["model-mismatch"][0].ranks == [3] and "rank-crashed" not in single


def test_same_seqnum_different_ops_on_two_hosts_is_a_collective_mismatch() -> None:
    line = ("[rank{r}]:[E1122 10:30:00.000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=12, OpType={op}, NumelIn=4, NumelOut=4, Timeout(ms)=600000) ran for 600010 "
            "milliseconds before timing out.\n")
    found = by_id({"node0.log": line.format(r=0, op="ALLREDUCE") + line.format(r=1, op="ALLREDUCE"),
                   "node1.log": line.format(r=2, op="BROADCAST") + line.format(r=3, op="ALLREDUCE")})
    (m,) = found["collective-mismatch"]
    assert m.evidence["collectives"]["2"]["op"] == "BROADCAST"
    assert found["hang"][0].evidence["culprit_ranks"] == [2]


def test_old_wording_without_seqnum_one_rank_in_another_op() -> None:
    line = ("[E ProcessGroupNCCL.cpp:587] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(OpType={op}, Timeout(ms)=1800000) ran for 1800523 milliseconds before timing out.\n")
    found = by_id({"job.log": "".join(line.format(r=r, op="BROADCAST" if r == 1 else "ALLREDUCE") for r in range(4))})
    assert found["hang"][0].evidence["culprit_ranks"] == [1]
    assert "collective-mismatch" in found


def test_watchdog_stuck_fatal_line() -> None:
    found = by_id({"rank3.log": "[F1122 10:00:00.000 ProcessGroupNCCL.cpp:1400] [PG ID 0 PG GUID 0(default_pg) "
                                "Rank 3] ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress "
                                "in monitoring enqueued collectives.\n"})
    (f,) = found["watchdog-stuck"]
    assert f.ranks == [3] and "480 s" in f.title


def test_nccl_error_names_gpu_and_host() -> None:
    found = by_id({"node7.log": "node7:2841:2901 [5] NCCL WARN Cuda failure 'an illegal memory access was "
                                "encountered'\nnode7:2841:2901 [5] NCCL INFO init.cc:1200 -> 1\n"})
    (f,) = found["nccl-error"]
    assert f.evidence["where"] == ["node7 GPU 5"]


def test_traceback_rank_is_root_cause_over_store_errors() -> None:
    found = by_id({
        "rank0.log": "[E socket.cpp:1] recvValue failed on SocketImpl(fd=4): Connection reset by peer\n"
                     "torch.distributed.DistNetworkError: Connection reset by peer\n",
        "rank1.log": 'Traceback (most recent call last):\n  File "/job/train.py", line 5, in <module>\n'
                     "KeyError: 'label'\n",
    })
    (crash,) = found["rank-crashed"]
    assert crash.ranks == [1] and crash.evidence["victim_ranks"] == [0]
    assert "store-failure" not in found


def test_store_failure_alone_and_setup_failure() -> None:
    found = by_id({"rank1.log": "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection "
                                "to the C10d store has failed. See inner exception for details.\n"})
    assert found["store-failure"][0].ranks == [1]
    found = by_id({"rank0.log": "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
                                "1/2 clients joined.\n"})
    assert "1 of 2" in found["store-failure"][0].title


def test_never_silent_on_unknown_failure_lines() -> None:
    found = by_id({"node0.log": "starting\n[E1122 10:00:00.000 foo.cpp:3] something odd broke\nexitcode: 3\n"})
    (f,) = found["unrecognised-failure"]
    assert "something odd broke" in str(f.evidence["first_lines"])


def test_healthy_log_with_scary_lines_raises_nothing() -> None:
    text = ("node1:1:1 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
            "node1:1:1 [0] NCCL WARN Could not find real path of /sys/class/net/eth0/device\n"
            "WARNING:torch.distributed.run:Setting OMP_NUM_THREADS environment variable\n"
            "node1:1:1 [0] NCCL WARN [Proxy Service] Failed to execute operation Close from rank 1, retcode 3\n"
            "training done\n")
    assert explain_texts({"rank0.log": text}) == []


def test_files_of_several_nodes_are_merged_on_their_timestamps(tmp_path) -> None:
    from ddpdoctor.logs.explain import explain_paths

    # node1's OOM happened first (10:00:01), node0's watchdog timeout later (10:10:00) although node0.log comes first.
    (tmp_path / "node0.log").write_text(
        "[rank0]:[E1122 10:10:00.000 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600100 milliseconds "
        "before timing out.\n")
    (tmp_path / "node1.log").write_text(
        "[rank1]:[E1122 10:00:00.500 trainer.py:10] step 5\n"
        "[rank1]:[E1122 10:00:01.000 trainer.py:11] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB. GPU 1 has a total capacity of 79.15 GiB\n")
    report = explain_paths([str(tmp_path)])
    timeline = report.sections["timeline"]
    assert [t["rank"] for t in timeline][:2] == [1, 1] and timeline[-1]["rank"] == 0
    assert report.findings[0].id == "oom" and report.findings[0].ranks == [1]
    assert report.findings[0].evidence["victim_ranks"] == [0]


@pytest.mark.parametrize(("text", "reason"), [
    ("slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT 2024-05-01T10:00:00 DUE TO TIME LIMIT ***",
     "time limit"),
    ("slurmstepd: error: *** STEP 4242.0 ON gpu-node-07 CANCELLED AT 2024-05-01T10:00:00 ***", "cancelled"),
    ("[2024-05-01 10:00:00,000] torch.distributed.elastic.agent.server.api: [WARNING] Received 15 death signal, "
     "shutting down workers", "SIGTERM"),
])
def test_job_stopped_from_outside(text: str, reason: str) -> None:
    found = by_id({"job.log": text + "\nSending process 11 closing signal SIGTERM\n"
                   "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15\n"
                   "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by "
                   "peer [10.0.0.2]:6061\n"})
    (f,) = found["job-stopped"]
    assert reason in f.title
    assert "peer-lost" not in found and "unrecognised-failure" not in found


def test_store_key_errors_are_victims() -> None:
    event = _one("torch.distributed.DistBackendError: [1] is setting up NCCL communicator and retrieving ncclUniqueId "
                 "from [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout")
    assert isinstance(event, FailureLine) and (event.kind, event.role) == ("store", "victim")


def test_the_earlier_crash_of_two_files_comes_first(tmp_path) -> None:
    from ddpdoctor.logs.explain import explain_paths

    tb = ('[2024-05-01 10:{m}:00,000] Traceback (most recent call last):\n  File "/job/train.py", line {n}, in <module>\n'
          "{exc}\n")
    (tmp_path / "a_rank0.log").write_text(tb.format(m="30", n=5, exc="KeyError: 'label'"))
    (tmp_path / "b_rank1.log").write_text(tb.format(m="10", n=9, exc="ValueError: bad shard"))
    crashes = [f for f in explain_paths([str(tmp_path)]).findings if f.id == "rank-crashed"]
    assert [f.ranks for f in crashes] == [[1], [0]]


def test_the_grammar_document_covers_every_rule_and_finding() -> None:
    from pathlib import Path

    from ddpdoctor.logs import grammar

    root = Path(__file__).resolve().parents[2] / "docs"
    doc, findings_doc = (root / "logs-grammar.md").read_text(), (root / "findings.md").read_text()
    for rule in grammar.RULES:
        assert f"`{rule.kind}`" in doc, rule.kind
        assert rule.versions
    for fid in ("oom", "model-mismatch", "cuda-error", "nccl-error", "watchdog-stuck", "store-failure", "peer-lost",
                "job-stopped", "unrecognised-failure", "p2p-consumer-gpu", "gpus-behind-pcie-switch",
                "ofi-no-efa-device", "nccl-tests-no-mpi", "comm-per-node", "nccl-shared-mem-exceeded"):
        assert f"### {fid}" in findings_doc, fid


@pytest.mark.parametrize(("text", "rank", "logger"), [
    ("worker-1: [rank9]:[E1122 10:00:00.000 ProcessGroupNCCL.cpp:616] [Rank 9] x", 9, "E"),
    ("B-nemo-ft3/0 [default1]:[rank1]: torch.distributed.DistBackendError: y", 1, ""),
    ("node3: E1122 10:23:15.599000 8860 torch/distributed/elastic/multiprocessing/api.py:869] z", None, "E"),
    ("Epoch 3: [00:10<00:00, loss=0.12]", None, ""),
    ("note: [rank1] is not a prefix here", None, ""),
])
def test_host_and_tag_prefixes_of_multi_node_launchers(text: str, rank: int | None, logger: str) -> None:
    (line,) = split_lines("job.log", text)
    assert (line.rank, line.logger) == (rank, logger)

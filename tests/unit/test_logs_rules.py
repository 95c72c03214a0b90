"""The rules on hand-made logs whose right answer is worked out by hand (culprit, victim, collective)."""

from __future__ import annotations

from ddpdoctor.logs.explain import explain_texts


def by_id(findings):
    out = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def watchdog(rank: int, seq: int, enq: int, done: int, ran: int = 600050) -> str:
    return (f"[rank{rank}]:[E1122 01:02:03.000 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective "
            f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=10, NumelOut=10, "
            f"Timeout(ms)=600000) ran for {ran} milliseconds before timing out.\n"
            f"[rank{rank}]:[E1122 01:02:03.000 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank {rank}] "
            f"Exception (either an error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: "
            f"{enq}, last completed NCCL work: {done}.\n")


def test_nccl_lowest_last_enqueued_is_the_culprit():
    # Ranks 0, 1 and 3 enqueued #12 and wait in #11; rank 2 only got to #10: it never launched #11.
    text = watchdog(0, 11, 12, 10) + watchdog(1, 11, 12, 10, ran=600070) + watchdog(2, 10, 10, 9) + watchdog(3, 11,
                                                                                                             12, 10)
    (hang,) = by_id(explain_texts({"job.log": text}))["hang"]
    ev = hang.evidence
    assert ev["culprit_ranks"] == [2]
    assert ev["stalled_ranks"] == [0, 1, 3]
    assert ev["collective"] == {"op": "ALLREDUCE", "seq": 11, "group": "default_pg"}
    assert ev["detected_after_s"] == 600.07
    assert set(ev) >= {"stalled_ranks", "culprit_ranks", "collective", "call_sites", "stacks", "detected_after_s"}


def test_nccl_same_seq_everywhere_names_the_silent_rank():
    # Every rank that timed out is in #5; rank 1 printed something but never timed out: it never entered #5.
    text = watchdog(0, 5, 5, 4) + watchdog(2, 5, 5, 4) + "[rank1]: loading shard 17 ...\n"
    (hang,) = by_id(explain_texts({"job.log": text}))["hang"]
    assert hang.evidence["culprit_ranks"] == [1]
    assert hang.evidence["stalled_ranks"] == [0, 2]
    assert hang.evidence["collective"]["seq"] == 5


def test_nccl_same_seq_and_no_other_rank_known_names_nobody():
    (hang,) = by_id(explain_texts({"job.log": watchdog(0, 5, 5, 4) + watchdog(1, 5, 5, 4)}))["hang"]
    assert hang.evidence["culprit_ranks"] == [] and hang.evidence["stalled_ranks"] == [0, 1]


TB = '[rank{r}]: Traceback (most recent call last):\n[rank{r}]:   File "/home/u/train.py", line {line}, in main\n' \
     "[rank{r}]:     {code}\n[rank{r}]: {exc}\n"


def test_the_victim_is_not_the_crash():
    text = (TB.format(r=0, line=50, code="loss.backward()",
                      exc="RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4000")
            + TB.format(r=1, line=31, code="x = load(i)", exc="FileNotFoundError: shard-00017.tar"))
    found = by_id(explain_texts({"job.log": text}))
    (crash,) = found["rank-crashed"]
    assert crash.evidence["rank"] == 1
    assert crash.evidence["exception"] == "FileNotFoundError: shard-00017.tar"
    assert "train.py\", line 31" in crash.evidence["traceback"]
    assert crash.evidence["call_site"] == "/home/u/train.py:31"
    assert "hang" not in found


TABLE = """Failures:
[1]:
  time      : 2026-11-22_10:23:10
  host      : n1
  rank      : {other} (local_rank: {other})
  exitcode  : {other_code} (pid: 2)
  error_file: <N/A>
  traceback : {other_tb}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:23:10
  host      : n1
  rank      : {root} (local_rank: {root})
  exitcode  : {root_code} (pid: 1)
  error_file: <N/A>
  traceback : {root_tb}
============================================================
"""


def test_torchrun_root_cause_that_is_a_victim_is_flagged():
    text = (TB.format(r=1, line=31, code="x = load(i)", exc="ValueError: bad")
            + TB.format(r=0, line=50, code="dist.all_reduce(t)",
                        exc="RuntimeError: Timed out waiting 6000ms for recv operation to complete")
            + TABLE.format(other=1, other_code=-15, other_tb="Signal 15 (SIGTERM) received by PID 2",
                           root=0, root_code=1, root_tb="To enable traceback see: https://pytorch.org"))
    found = by_id(explain_texts({"job.log": text}))
    assert [f.evidence["rank"] for f in found["rank-crashed"]] == [1]
    (mis,) = found["misleading-root-cause"]
    assert mis.evidence["reported_rank"] == 0 and mis.evidence["culprit_ranks"] == [1]
    (hang,) = found["hang"]
    assert hang.evidence["stalled_ranks"] == [0] and hang.evidence["culprit_ranks"] == [1]
    assert hang.evidence["call_sites"]["0"] == "/home/u/train.py:50"


def test_sigkill_without_traceback_is_a_crash_and_sigabrt_everywhere_is_not():
    killed = TABLE.format(other=1, other_code=-15, other_tb="Signal 15 (SIGTERM) received by PID 2",
                          root=0, root_code=-9, root_tb="Signal 9 (SIGKILL) received by PID 1")
    (crash,) = by_id(explain_texts({"a.log": killed}))["rank-crashed"]
    assert crash.evidence["rank"] == 0 and "SIGKILL" in crash.evidence["exception"] and "OOM" in crash.advice
    aborted = TABLE.format(other=1, other_code=-6, other_tb="Signal 6 (SIGABRT) received by PID 2",
                           root=0, root_code=-6, root_tb="Signal 6 (SIGABRT) received by PID 1")
    found = by_id(explain_texts({"b.log": aborted}))
    assert "rank-crashed" not in found
    (failed,) = found["job-failed"]
    assert failed.evidence["reported_root_cause_rank"] == 0 and "watchdog" in failed.advice


def test_mismatch_prefers_each_ranks_own_fingerprint():
    def fp(seq, op, shape=""):
        return f"CollectiveFingerPrint(SequenceNumber={seq}, OpType={op}{', TensorShape=[' + shape + ']' if shape else ''})"
    text = (f"[rank0]: RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
            f"{fp(3, 'ALLREDUCE', '4')}, but Rank 1 is running collective: {fp(2, 'REDUCE')}.Collectives differ\n"
            f"[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
            f"{fp(2, 'BARRIER')}, but Rank 0 is running collective: {fp(2, 'GATHER')}.Collectives differ\n")
    (m,) = by_id(explain_texts({"job.log": text}))["collective-mismatch"]
    assert m.evidence["collectives"]["0"]["op"] == "ALLREDUCE" and m.evidence["collectives"]["1"]["op"] == "BARRIER"
    assert m.evidence["behind_ranks"] == [1]
    assert "seq: rank 0 3 vs rank 1 2" in m.evidence["differs"]


def test_unused_parameters_union_over_ranks_from_file_names():
    found = explain_texts({
        "out/rank0.err": "Parameters which did not receive grad for rank 0: head.bias, head.weight\n",
        "out/rank1.err": "Parameter indices which did not receive grad for rank 1: 7 8\n",
    })
    (u,) = by_id(found)["unused-parameters"]
    assert u.evidence["names"] == ["head.bias", "head.weight"] and u.evidence["indices"] == [7, 8]
    assert u.ranks == [0, 1]


def test_healthy_log_has_no_findings():
    text = ("W1122 10:23:12.444000 8860 torch/distributed/run.py:874] Setting OMP_NUM_THREADS\n"
            "[rank0] step 10 loss 0.31\n[rank1] step 10 loss 0.30\n")
    assert explain_texts({"ok.log": text}) == []


def test_nccl_2_6_wording_and_stack_of_the_failed_collective():
    # torch >= 2.6 wording; the '#N fn from file:line' lines of LOG(ERROR) carry no rank prefix.
    def rank_lines(r: int, seq: int, enq: int, site: int) -> str:
        return (f"[rank{r}]:[E710 18:00:32.426182607 ProcessGroupNCCL.cpp:757] [Rank {r}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn=8, NumelOut=8, "
                f"Timeout(ms)=1800000) ran for 1800077 milliseconds before timing out.\n"
                f"[rank{r}]:[E710 18:00:32.426302794 ProcessGroupNCCL.cpp:2395] [PG ID 0 PG GUID 0(default_pg) Rank {r}]"
                f"  failure detected by watchdog at work sequence id: {seq} PG status: last enqueued work: {enq}, "
                f"last completed work: {seq - 1}\n"
                f"[rank{r}]:[E710 18:00:32.427312432 ProcessGroupNCCL.cpp:801] Stack trace of the failed collective: \n"
                "#0 all_reduce from /usr/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py:3174\n"
                "#1 wrapper from /usr/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83\n"
                f"#2 sync_metrics from /home/u/train.py:{site}\n"
                "#3 main from /home/u/train.py:200\n")
    text = rank_lines(0, 40, 41, 88) + rank_lines(1, 39, 39, 88)
    (hang,) = by_id(explain_texts({"job.log": text}))["hang"]
    ev = hang.evidence
    assert ev["culprit_ranks"] == [1] and ev["stalled_ranks"] == [0]
    assert ev["collective"] == {"op": "ALLREDUCE", "seq": 40, "group": "default_pg"}
    assert ev["call_sites"] == {"0": "/home/u/train.py:88", "1": "/home/u/train.py:88"}
    assert ev["stacks"]["0"].startswith("#0 all_reduce from")
    assert ev["per_rank"]["1"]["last_enqueued"] == 39


def test_slurm_labelled_output_and_srun_failures():
    text = ("1: Traceback (most recent call last):\n"
            "0: step 10 loss 0.5\n"
            '1:   File "/home/u/train.py", line 31, in <module>\n'
            "1:     x = load(i)\n"
            "1: FileNotFoundError: shard-00017.tar\n"
            "0: Traceback (most recent call last):\n"
            '0:   File "/home/u/train.py", line 50, in <module>\n'
            "0:     dist.all_reduce(t)\n"
            "0: RuntimeError: [pair.cc:598] Connection closed by peer [10.0.0.2]:5337\n"
            "srun: error: node13: task 1: Exited with exit code 1\n"
            "srun: error: node12: task 0: Exited with exit code 1\n"
            "slurmstepd: error: *** STEP 4242.0 ON node12 CANCELLED AT 2026-11-22T10:00:00 ***\n")
    found = by_id(explain_texts({"slurm-4242.out": text}))
    (crash,) = found["rank-crashed"]
    assert crash.evidence["rank"] == 1 and crash.evidence["exception"] == "FileNotFoundError: shard-00017.tar"
    assert set(found) == {"rank-crashed"}


def test_oom_kill_without_rank_is_a_crash():
    text = ("[rank0]: step 3\n"
            "slurmstepd: error: Detected 1 oom_kill event in StepId=99.0. Some of the step tasks have been OOM Killed.\n")
    (crash,) = by_id(explain_texts({"slurm.out": text}))["rank-crashed"]
    assert crash.evidence["rank"] is None and "OOM" in crash.evidence["exception"] and "OOM" in crash.advice


def test_torchelastic_error_json_from_record():
    # The file torchrun's @record writes per rank (torch/distributed/elastic/multiprocessing/errors/error_handler.py).
    doc = ('{"message": {"message": "KeyError: \'label\'", "extraInfo": {"py_callstack": "Traceback (most recent call '
           'last):\\n  File \\"/home/u/train.py\\", line 40, in main\\n    batch = next(it)\\nKeyError: \'label\'\\n", '
           '"timestamp": "1763800000"}}}')
    (crash,) = by_id(explain_texts({"/tmp/torchelastic_x/attempt_0/3/error.json": doc}))["rank-crashed"]
    assert crash.evidence["rank"] == 3 and crash.evidence["exception"] == "KeyError: 'label'"
    assert crash.evidence["call_site"] == "/home/u/train.py:40"


def test_nccl_same_seq_different_sizes_is_a_mismatch():
    def line(r: int, numel: int) -> str:
        return (f"[rank{r}]:[E1122 01:02:03.000 ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective "
                f"operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
                f"Timeout(ms)=600000) ran for 600050 milliseconds before timing out.\n")
    found = by_id(explain_texts({"job.log": line(0, 1024) + line(1, 1000)}))
    assert found["hang"][0].evidence["stalled_ranks"] == [0, 1]
    (m,) = found["collective-mismatch"]
    assert m.evidence["differs"] == ["numel_in: rank 0 1024 vs rank 1 1000"]


def test_gloo_timeout_without_rank_names_no_culprit():
    text = ("RuntimeError: [unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete\n"
            + TABLE.format(other=1, other_code=-15, other_tb="Signal 15 (SIGTERM) received by PID 2",
                           root=0, root_code=1, root_tb="To enable traceback see: https://pytorch.org"))
    (hang,) = by_id(explain_texts({"job.log": text}))["hang"]
    assert hang.evidence["culprit_ranks"] == [] and hang.evidence["detected_after_s"] == 20.0

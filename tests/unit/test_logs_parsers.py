"""The log parsers on hand-written lines in each real format (torch 1.10 .. 2.13, torchrun, srun)."""

from __future__ import annotations

import os
import pickle

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.logs import flight_recorder
from ddpdoctor.logs.events import (
    FingerprintMismatch,
    GlooSizeMismatch,
    GlooTimeout,
    MonitoredBarrierFailure,
    UnusedParameters,
    WatchdogTimeout,
    WatchdogWorkState,
)
from ddpdoctor.logs.launchers import srun_failures, torchrun_failures
from ddpdoctor.logs.lines import rank_from_name, split_lines, streams
from ddpdoctor.logs.messages import parse_line
from ddpdoctor.logs.tracebacks import exceptions_in


def events_of(text: str, name: str = "job.log"):
    out = []
    for line in split_lines(name, text):
        out.extend(parse_line(line))
    return out


def test_rank_prefixes_stack_and_are_removed():
    lines = split_lines("x", "[default1]:[rank1]: Traceback (most recent call last):\n"
                             "[80746] [rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] hi\n"
                             "[rank3] EXCEPTION after 0.01s\n"
                             "E1122 10:23:15.599000 8860 torch/distributed/elastic/multiprocessing/api.py:1002] failed\n"
                             "plain")
    assert [(ln.rank, ln.text, ln.logger) for ln in lines] == [
        (1, "Traceback (most recent call last):", ""),
        (0, "[Rank 0] hi", "E"),
        (3, "EXCEPTION after 0.01s", ""),
        (None, "failed", "E"),
        (None, "plain", ""),
    ]


def test_srun_labels_only_when_the_file_uses_them():
    labelled = split_lines("x", "0: hello\n1: world\n 1: again\n")
    assert [ln.rank for ln in labelled] == [0, 1, 1]
    prose = split_lines("x", "a\nb\nc\nd\ne\nf\ng\n12: not a label\n")
    assert prose[-1].rank is None and prose[-1].text == "12: not a label"


def test_rank_from_file_names():
    assert rank_from_name("logs/rank3.err") == 3
    assert rank_from_name("/tmp/nccl_trace_rank_12") == 12
    assert rank_from_name("run/attempt_0/5/stderr.log") == 5
    assert rank_from_name("job.log") is None


def test_fingerprint_mismatch_with_shapes():
    line = ("[rank1]: RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
            "CollectiveFingerPrint(SequenceNumber=7, OpType=ALLREDUCE, TensorShape=[5, 2], TensorDtypes=Float, "
            "TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default))), but "
            "Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=7, OpType=ALLREDUCE, "
            "TensorShape=[4, 2], TensorDtypes=Float, TensorDeviceTypes=TensorOptions(dtype=float (default), "
            "device=cpu)).Collectives differ in the following aspects: \t Tensor Tensor shapes: 5, 2vs 4, 2")
    (m,) = events_of(line)
    assert isinstance(m, FingerprintMismatch)
    assert (m.reporter, m.self_rank, m.peer_rank) == (1, 1, 0)
    assert (m.self_fp.seq, m.self_fp.op, m.self_fp.shapes, m.self_fp.dtypes, m.self_fp.device) == (
        7, "ALLREDUCE", [[5, 2]], ["Float"], "cpu")
    assert m.peer_fp.shapes == [[4, 2]]
    assert m.differs == "Tensor Tensor shapes: 5, 2vs 4, 2"


def test_fingerprint_glued_fields_and_old_wording():
    (m,) = events_of("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
                     "CollectiveFingerPrint(SequenceNumber=1OpType=BARRIER), but Rank 2 is running collective: "
                     "CollectiveFingerPrint(SequenceNumber=0OpType=BARRIER).Collectives differ")
    assert (m.self_fp.seq, m.self_fp.op, m.peer_fp.seq, m.peer_fp.op) == (1, "BARRIER", 0, "BARRIER")
    (old,) = events_of("Detected mismatch between collectives on ranks. Rank 0 is running inconsistent collective: "
                       "CollectiveFingerPrint(OpType=BROADCAST, TensorShape=[10], TensorDtypes=Float)")
    assert (old.self_rank, old.self_fp.op, old.self_fp.seq, old.peer_rank) == (0, "BROADCAST", None, None)


def test_nccl_watchdog_formats():
    text = (
        "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
        "ran for 600020 milliseconds before timing out.\n"
        "[rank1]:[E626 06:24:44.906457629 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] "
        "Exception (either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, "
        "last completed NCCL work: 807.\n"
        "[E ProcessGroupNCCL.cpp:737] [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802211 milliseconds before timing out.\n")
    t1, s1, t3 = events_of(text)
    assert isinstance(t1, WatchdogTimeout) and isinstance(s1, WatchdogWorkState)
    assert (t1.rank, t1.seq, t1.op, t1.numel_in, t1.timeout_ms, t1.ran_for_ms) == (1, 808, "ALLREDUCE", 9801523,
                                                                                   600000, 600020)
    assert (s1.rank, s1.failed_seq, s1.last_enqueued, s1.last_completed, s1.group) == (1, 808, 811, 807, "default_pg")
    assert (t3.rank, t3.seq, t3.numel_in, t3.ran_for_ms) == (3, 469508, None, 1802211)


def test_gloo_monitored_barrier_and_unused():
    evs = events_of(
        "[rank0]:[E1122 10:24:41.253907795 ProcessGroupGloo.cpp:67] [Rank 0]: Ranks 1, 3 failed to pass "
        "monitoredBarrier in 20000 ms\n"
        "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size "
        "doesn't match expected size. Is there a distributed collective mismatch in your code?\n"
        "[rank1]: RuntimeError: [unbound_buffer.cc:78] Timed out waiting 20000ms for recv operation to complete\n"
        "[rank0]: Parameters which did not receive grad for rank 0: aux.bias, aux.weight, [...]\n"
        "[rank0]: Parameter indices which did not receive grad for rank 0: 4 5\n")
    mb, size, tmo, names, idx = evs
    assert isinstance(mb, MonitoredBarrierFailure) and (mb.reporter, mb.failed_ranks, mb.timeout_ms) == (0, [1, 3],
                                                                                                         20000)
    assert isinstance(size, GlooSizeMismatch) and (size.rank, size.received_bytes, size.expected_bytes) == (None, 8, 4)
    assert isinstance(tmo, GlooTimeout) and (tmo.rank, tmo.timeout_ms, tmo.operation) == (1, 20000, "recv")
    assert isinstance(names, UnusedParameters) and names.names == ["aux.bias", "aux.weight"]
    assert idx.indices == [4, 5] and idx.rank == 0


def test_tracebacks_per_rank_when_interleaved_and_chained():
    text = ("[rank0]: Traceback (most recent call last):\n"
            "[rank1]: Traceback (most recent call last):\n"
            '[rank0]:   File "/home/u/train.py", line 10, in <module>\n'
            '[rank1]:   File "/home/u/train.py", line 12, in <module>\n'
            "[rank0]:     dist.all_reduce(t)\n"
            "[rank1]:     load()\n"
            "[rank1]: ValueError: bad sample\n"
            "[rank0]: RuntimeError: Connection closed by peer\n"
            "[rank0]: \n"
            "[rank0]: During handling of the above exception, another exception occurred:\n"
            "[rank0]: \n"
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/home/u/train.py", line 20, in <module>\n'
            "[rank0]: OSError: disk full\n")
    lines = split_lines("x", text)
    by_rank = {rank: exceptions_in(s) for (_, rank), s in streams(lines).items()}
    (e1,) = by_rank[1]
    assert (e1.exc_type, e1.message, str(e1.user_frame()), e1.chained) == ("ValueError", "bad sample",
                                                                           "/home/u/train.py:12", False)
    first, second = by_rank[0]
    assert first.exc_type == "RuntimeError" and not first.chained
    assert second.exc_type == "OSError" and second.chained


def test_multiline_exception_message_stops_at_logger_lines():
    text = ("Traceback (most recent call last):\n"
            '  File "t.py", line 3, in <module>\n'
            "RuntimeError: Expected to have finished reduction in the prior iteration\n"
            "making sure all `forward` function outputs participate in calculating loss.\n"
            "W1122 16:23:31.944000 9340 torch/distributed/elastic/multiprocessing/api.py:1028] Sending SIGTERM\n")
    (exc,) = exceptions_in(split_lines("x", text))
    assert exc.message.endswith("calculating loss.") and "SIGTERM" not in exc.message


def test_torchrun_table_with_record_traceback():
    text = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-22_10:23:10
  host      : node7
  rank      : 5 (local_rank: 1)
  exitcode  : -15 (pid: 8823)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 8823
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_10:23:10
  host      : node7
  rank      : 4 (local_rank: 0)
  exitcode  : 1 (pid: 8822)
  error_file: /tmp/torchelastic/error.json
  traceback : Traceback (most recent call last):
    File "/home/u/train.py", line 40, in main
      batch = next(it)
  KeyError: 'label'
============================================================
"""
    failures, tracebacks = torchrun_failures(split_lines("x", text))
    assert [(f.rank, f.exitcode, f.signal, f.is_root_cause, f.host) for f in failures] == [
        (5, -15, "SIGTERM", False, "node7"), (4, 1, None, True, "node7")]
    (tb,) = tracebacks
    assert (tb.rank, tb.exc_type, tb.message, str(tb.user_frame())) == (4, "KeyError", "'label'",
                                                                       "/home/u/train.py:40")


def test_srun_task_failures_and_oom():
    text = ("srun: error: node12: task 3: Exited with exit code 1\n"
            "srun: error: node13: tasks 4-5: Killed\n"
            "slurmstepd: error: Detected 1 oom_kill event in StepId=99.0. Some of the step tasks have been OOM Killed.\n")
    got = [(f.rank, f.exitcode, f.signal, f.reporter) for f in srun_failures(split_lines("x", text))]
    assert got == [(3, 1, None, "srun"), (4, None, "SIGKILL", "srun"), (5, None, "SIGKILL", "srun"),
                   (None, None, "SIGKILL", "oom")]


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ddpdoctor_pwned",))


def test_restricted_unpickler_refuses_classes_and_loads_plain_dumps(tmp_path):
    evil = pickle.dumps({"version": "2.10", "entries": [_Evil()]})
    with pytest.raises(BadInput, match="refusing to load"):
        flight_recorder.loads_pickle(evil, "evil.pkl")
    assert not os.path.exists("/tmp/ddpdoctor_pwned")
    with pytest.raises(BadInput, match="not a Flight Recorder dump"):
        flight_recorder.loads_pickle(pickle.dumps({"a": 1}), "x.pkl")
    with pytest.raises(BadInput):
        flight_recorder.loads_pickle(pickle.dumps({"version": "1", "entries": {1, 2}}, protocol=4), "set.pkl")
    plain = {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": "4", "last_completed_collective": "3",
                                                    "last_started_collective": "4"}},
             "entries": [{"pg_id": 0, "collective_seq_id": 4, "profiling_name": "nccl:all_reduce", "state": "started",
                          "input_sizes": [[8]], "process_group": ("0", "default_pg"),
                          "frames": [{"name": "all_reduce", "filename": "/x/site-packages/torch/d.py", "line": 1},
                                     {"name": "step", "filename": "/home/u/train.py", "line": 77}]}]}
    states = flight_recorder.group_states(flight_recorder.loads_pickle(pickle.dumps(plain), "r0.pkl"))
    st = states["0"]
    assert (st.group, st.last_enqueued, st.last_started, st.last_completed) == ("0 (default_pg)", 4, 4, 3)
    assert st.collectives[4].op == "all_reduce" and st.collectives[4].call_site == "/home/u/train.py:77"

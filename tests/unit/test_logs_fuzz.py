"""Fuzzing: the log explainer never raises on any text, and the Flight Recorder reader only ever raises BadInput."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpdoctor.errors import BadInput
from ddpdoctor.logs import flight_recorder
from ddpdoctor.logs.explain import explain_texts
from tests.conftest import REPO

FIX = REPO / "tests" / "fixtures" / "logs"
REAL_LINES = [ln for p in sorted(FIX.glob("*.log")) + sorted((FIX / "real").glob("*.log"))
              for ln in p.read_text().splitlines()]
FRAGMENTS = ["[rank1]:", "[default0]:", "Traceback (most recent call last):", '  File "x.py", line 3, in f',
             "Failures:", "Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
             "  exitcode  : -9 (pid: 1)", "  traceback : Traceback (most recent call last):",
             "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, Timeout(ms)=5)", "last enqueued NCCL work: 4",
             "CollectiveFingerPrint(SequenceNumber=", "Detected mismatch between collectives on ranks. Rank 0 is "
             "running collective: ", "failed to pass monitoredBarrier in ", "0: ", "srun: error: n: tasks 0-3: Killed",
             "During handling of the above exception, another exception occurred:", "Fatal Python error: x", "{",
             "=" * 20, "-" * 20, "terminate called after throwing an instance of 'x'", "  what():  y",
             "h:1:2 [0] NCCL WARN ", "h:1:2 [x] NCCL WARN Cuda failure", "failed (exitcode: -99999999999) local_rank: 7 "
             "(pid: 1)", "DDP expects same model across all ranks, but Rank 9 has 1 params, while rank 9 has "
             "inconsistent 1 params.", "[E9999 99:99:99.9 a.cpp:1] ", "[2024-13-45 99:99:99,9] x", "Killed",
             "Aborted (core dumped)", "params[0] in this process with sizes [] appears not to match sizes of the same "
             "param in process 0."]

line = st.one_of(st.sampled_from(REAL_LINES), st.sampled_from(FRAGMENTS), st.text(max_size=80))
texts = st.lists(st.lists(line, max_size=40).map("\n".join), min_size=1, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, st.sampled_from(["job.log", "rank3.err", "fr_rank1.json", "attempt_0/2/stderr.log"]))
def test_explain_texts_never_raises(parts, name):
    findings = explain_texts({f"{i}-{name}": t for i, t in enumerate(parts)})
    for f in findings:
        f.to_json()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(REAL_LINES), min_size=0, max_size=60), st.randoms())
def test_shuffled_real_lines_never_raise(lines, rnd):
    rnd.shuffle(lines)
    explain_texts({"job.log": "\n".join(lines)})


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300))
def test_unpickler_only_raises_bad_input(data):
    try:
        flight_recorder.loads_pickle(b"\x80\x04" + data, "x.pkl")
    except BadInput:
        pass


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=3000), st.binary(min_size=1, max_size=4))
def test_corrupted_real_dump_only_raises_bad_input(pos, junk):
    data = bytearray((FIX / "fr_rank0.pkl").read_bytes())
    pos = pos % len(data)
    data[pos:pos + len(junk)] = junk
    try:
        dump = flight_recorder.loads_pickle(bytes(data), "x.pkl")
        flight_recorder.group_states(dump)
    except BadInput:
        pass
    assert flight_recorder.loads_pickle((FIX / "fr_rank0.pkl").read_bytes(), "fr_rank0.pkl")["entries"]

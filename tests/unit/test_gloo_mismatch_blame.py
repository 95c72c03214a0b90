"""gloo aborts the rank that *received* a mismatched collective's bytes ("Received data size doesn't match"): the
rank to blame is the one that sent them (docs/accuracy.md, miss 1; docs/hangs.md#gloo-mismatch). Hand-made
evidence in the shape the benchmark's runs left (hang-skip-allreduce-2r/-4r, hang-shape-mismatch-2r)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ddpdoctor.findings.crash import crash_findings, gloo_mismatch_culprits
from ddpdoctor.findings.hang import DDP_BUCKETS
from ddpdoctor.findings.model import Severity
from ddpdoctor.reports.watched import watched_report
from ddpdoctor.rundir.layout import RunDir

ABORT = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
         "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. {got} vs 4. Received data "
         "size doesn't match expected size.\nFatal Python error: Aborted\n\n"
         "Current thread 0x0002 (most recent call first):\n"
         '  File "/job/train.py", line 16 in <module>\n')
RESET = {"exception": "RuntimeError: [pair.cc:534] Connection reset by peer", "ended_at": 3.0}


def _in(op: str, sizes: list[list[int]], site: str = "/job/train.py:16", seq: int = 10) -> dict:
    return {"op": op, "group": "default_pg", "seq": seq, "sizes": sizes, "call_site": site}


# The rank that skipped: its last completed collective is the metric all_reduce of the step before (#8).
SKIPPER = {**RESET, "last_collective": _in("all_reduce", [[1]], seq=8),
           "failed_collective": _in(DDP_BUCKETS, [], "/job/train.py:13")}


def _metric(step: int) -> dict:
    return {"step": step, "phase": "other", "collective": _in("all_reduce", [[1]]), "where": "/job/train.py:16"}


def _backward(step: int) -> dict:
    return {"step": step, "phase": "backward", "collective": None, "where": "/job/train.py:13",
            "backward": {"call_site": "/job/train.py:13", "since": 1.0, "group": "default_pg", "seq": 9}}


def test_the_rank_a_step_ahead_skipped_the_collective_not_the_rank_gloo_aborted() -> None:
    statuses = {0: None, 1: SKIPPER}
    findings = crash_findings(statuses, stderr={0: ABORT.format(got=676)}, last_beats={0: _metric(3), 1: _backward(4)})
    assert [f.id for f in findings] == ["collective-mismatch"]  # rank 0's abort is no crash of its own
    (mm,) = findings
    assert mm.ranks == [1] and mm.evidence["culprit_ranks"] == [1] and mm.evidence["why"] == "skipped"
    assert mm.evidence["aborted"]["rank"] == 0 and mm.evidence["collectives"]["1"]["op"] == DDP_BUCKETS
    assert mm.title.startswith("Rank(s) 1 caused a collective mismatch")


def test_on_four_ranks_the_waiting_ranks_are_not_blamed_and_identical_collectives_are_said_once() -> None:
    # as recorded: gloo aborted rank 1, rank 0 got "Connection closed", torchrun stopped ranks 2 and 3 (their
    # statuses still say which collective they were in)
    statuses = {0: {**RESET, "failed_collective": _in("all_reduce", [[1]])}, 1: None,
                2: {"exit_code": 143, "failed_collective": _in(DDP_BUCKETS, [], "/job/train.py:13"),
                    "last_collective": _in("all_reduce", [[1]], seq=8)},
                3: {"exit_code": 143, "failed_collective": _in("all_reduce", [[1]])}}
    beats = {0: _metric(3), 1: _metric(3), 2: _backward(4), 3: _metric(3)}
    (mm,) = crash_findings(statuses, stderr={1: ABORT.format(got=676)}, last_beats=beats)
    assert mm.id == "collective-mismatch" and mm.ranks == [2] and mm.evidence["why"] == "skipped"
    assert "ranks 0, 1, 3 all_reduce [[1]] at /job/train.py:16, rank 2 " in mm.title
    assert {"op", "bytes"} <= set(mm.evidence["differs"])


def test_on_two_ranks_with_other_sizes_the_sender_is_blamed() -> None:
    statuses = {0: None, 1: {**RESET, "failed_collective": _in("all_reduce", [[8]])}}
    beats = {0: {**_metric(3), "collective": _in("all_reduce", [[4]])}, 1: _metric(3)}
    findings = crash_findings(statuses, stderr={0: ABORT.format(got=8)}, last_beats=beats)
    (mm,) = findings
    assert mm.ranks == [1] and mm.evidence["why"] == "sender"


def test_what_does_not_tell_the_ranks_apart_still_names_the_aborted_rank() -> None:
    same = {0: _in("all_reduce", [[4]]), 1: _in("all_reduce", [[4]])}
    assert gloo_mismatch_culprits(same, {}, receiver=0) is None
    metric = {1: _in("all_reduce", [[1]], seq=8)}
    # A rank in a barrier ran out of data (it left the loop): not a skip by the rank in DDP's all-reduce.
    left = {0: _in("barrier", []), 1: _in(DDP_BUCKETS, [])}
    assert gloo_mismatch_culprits(left, metric, receiver=0) == ([0], "left-or-extra")
    # An extra broadcast the others never ran: the rank that called it, whoever gloo aborted.
    extra = {0: _in(DDP_BUCKETS, []), 1: _in("broadcast", [[3]], "/job/train.py:5")}
    assert gloo_mismatch_culprits(extra, {0: _in("all_reduce", [[1]], seq=8)}, receiver=0) == ([1], "left-or-extra")
    # the odd one out among many, whatever the steps say
    odd = {r: _in("all_reduce", [[8]] if r == 2 else [[4]]) for r in range(4)}
    assert gloo_mismatch_culprits(odd, {}, receiver=3) == ([2], "odd-one-out")


def test_the_hang_that_follows_the_abort_blames_the_mismatch_culprit_not_the_ranks_that_ended() -> None:
    from ddpdoctor.findings.hang import hang_findings

    statuses = {0: None, 1: None, 2: SKIPPER, 3: None}
    beats = {0: _metric(3), 1: _metric(3), 2: _backward(4), 3: _metric(3)}
    (mm,) = crash_findings(statuses, stderr={3: ABORT.format(got=676)}, last_beats=beats)
    gone = {"state": "exited", "call_site": "/job/train.py:16"}
    positions = {"0": gone, "2": gone, "3": gone,
                 "1": {"state": "in-collective", "op": "all_reduce", "call_site": "/job/train.py:16"}}
    hang = {"diagnosis": {"kind": "rank-exited", "stalled_ranks": [1], "culprit_ranks": [0, 2, 3],
                          "positions": positions, "reason": "rank(s) [0, 2, 3] left (or never reported)"},
            "detected_after_s": 30.0, "hang_timeout_s": 30.0}
    (h,) = hang_findings(hang, aborted_mismatch=mm)
    assert h.evidence["kind"] == "mismatch" and h.evidence["culprit_ranks"] == [2] and h.ranks == [2]
    assert "left" not in h.title
    # without a mismatch told apart, the monitor's verdict stands
    assert hang_findings(hang)[0].evidence["kind"] == "rank-exited"


def test_a_recorded_skip_on_two_ranks_blames_the_rank_that_skipped(tmp_path: Path) -> None:
    # tests/fixtures/gloo_skip_2r: hang-skip-allreduce-2r of the fault benchmark (`run.py --keep`), trimmed (the
    # lock, report.json, live/, traces, torchrun's per-attempt copies, ledgers and stacks removed; paths made
    # /repo/). Rank 1 skipped the metric all_reduce (step 6, in backward); gloo aborted rank 0 (676 vs 4 bytes),
    # which left no status. Before, the report said rank 0 "ended without a status" and rank 0 failed first.
    dst = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "gloo_skip_2r", dst)
    report = watched_report(RunDir(dst), "run", locked=False)
    errors = [(f.id, f.ranks) for f in report.findings if f.severity is Severity.ERROR]
    assert errors == [("collective-mismatch", [1])], report.findings
    assert report.findings[[f.id for f in report.findings].index("collective-mismatch")].evidence["why"] == "skipped"


def test_a_recorded_skip_on_four_ranks_blames_the_rank_that_skipped(tmp_path: Path) -> None:
    # tests/fixtures/gloo_skip_4r: hang-skip-allreduce-4r, trimmed the same way. Rank 2 skipped; gloo aborted rank 1
    # (340 vs 4 bytes), rank 0 got "Connection closed by peer", torchrun stopped ranks 2 and 3. Before, the
    # mismatch named rank 1 (the aborted one); with the steps of the last heartbeats, rank 0.
    dst = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "gloo_skip_4r", dst)
    report = watched_report(RunDir(dst), "run", locked=False)
    errors = [(f.id, f.ranks) for f in report.findings if f.severity is Severity.ERROR]
    assert errors == [("collective-mismatch", [2])], report.findings
    (mm,) = [f for f in report.findings if f.id == "collective-mismatch"]
    assert mm.evidence["why"] == "skipped" and sorted(mm.evidence["collectives"]) == ["0", "1", "2", "3"]
    assert "ranks 0, 1, 3 all_reduce [[1]]" in mm.title


def test_a_job_without_ddp_gets_no_ddp_reading() -> None:
    # The shape of an FSDP2 job whose rank 1 skipped a unit's forward (tests/scenarios/fsdp_train.py, tried by hand):
    # gloo aborted rank 1, whose last beat was in step 1's backward; rank 0 got "Connection reset" in unit '4''s
    # all-gather wait. Read as DDP's, rank 1 was "in DDP's gradient all-reduce" and rank 0 blamed for leaving the
    # loop; without DDP, a rank in backward() waits in no bucket all-reduce, and only the bytes tell the ranks apart.
    wait = {**_in("wait (async collective)", []), "group": None, "seq": None}
    statuses = {0: {**RESET, "failed_collective": wait, "last_collective": {"op": "backward (DDP gradient all-reduce)",
                                                                           "call_site": "/job/train.py:13"}}, 1: None}
    beats = {0: _metric(2), 1: _backward(1)}
    (as_ddp,) = crash_findings(statuses, stderr={1: ABORT.format(got=65792)}, last_beats=beats)
    assert as_ddp.evidence["why"] == "left-or-extra" and "DDP" in as_ddp.title
    mm, crashed = crash_findings(statuses, stderr={1: ABORT.format(got=65792)}, last_beats=beats, ddp=False)
    # rank 1 names no collective (it was computing in backward at its last beat): nothing tells who sent what, so
    # both ranks are named, and the aborted rank is the one that failed first
    assert mm.id == "collective-mismatch" and mm.ranks == [0, 1] and "why" not in mm.evidence
    assert "DDP" not in mm.title and "rank 1 a collective it did not name" in mm.title
    assert crashed.id == "rank-crashed" and crashed.ranks == [1]

"""A rank whose data ran out first (hang-loader-exhausted-2r; docs/accuracy.md miss 6): the reason says so beside
the other cause that looks the same (an extra barrier), the kind stays a mismatch. Positions as the benchmark's run recorded them: rank 0 in the end-of-epoch barrier entered
from the data phase at step 5, rank 1 in step 5's backward (DDP's all-reduce) at the same sequence number."""

from __future__ import annotations

from ddpdoctor.findings.hang import DDP_BUCKETS, RankPosition, diagnose_hang, hang_findings


def _ddp(rank: int, step: int = 5) -> RankPosition:
    return RankPosition(rank, "in-collective", "backward", step, DDP_BUCKETS, "default_pg", 11, [], "_bench.py:56")


def test_a_rank_in_a_barrier_after_asking_for_a_batch_may_have_run_out_of_data() -> None:
    # The same positions come from an extra barrier at the top of the loop (tests/e2e/test_multinode.py's
    # mn_one_node_collective): the kind stays a mismatch, and the reason names both causes.
    ps = {0: RankPosition(0, "in-collective", "data", 5, "barrier", "default_pg", 11, [], "hang.py:73"), 1: _ddp(1)}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "mismatch" and d.culprit_ranks == [0]
    assert "left the training loop early or called an extra barrier" in d.reason and "data ran out" in d.reason
    fs = hang_findings({"diagnosis": d.to_json(), "detected_after_s": 4.0, "hang_timeout_s": 3.0})
    assert [f.evidence["kind"] for f in fs if f.id == "hang"] == ["mismatch"]


def test_an_extra_collective_at_the_top_of_the_loop_is_still_a_mismatch() -> None:
    ps = {0: _ddp(0), 1: RankPosition(1, "in-collective", "data", 5, "broadcast", "default_pg", 11, [[3]], "t.py:86")}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "mismatch" and d.culprit_ranks == [1]


def test_a_rank_whose_loader_raised_stop_iteration_is_named_loader_exhausted() -> None:
    """The loader's own StopIteration (probes/data_position.py, the beat's ``data_dry``) is the positive evidence:
    the same positions with it are ``loader-exhausted``, through the job's record as on one node."""
    from ddpdoctor.job.record import RankRecord, decode, encode, record
    from ddpdoctor.job.state import to_position

    beat0 = {"step": 5, "phase": "data", "data_dry": 5, "collective": {
        "op": "barrier", "group": "default_pg", "seq": 11, "call_site": "hang.py:73", "sizes": []}}
    beat1 = {"step": 5, "phase": "backward", "backward": {"group": "default_pg", "seq": 11, "call_site": "b.py:56"}}
    recs = decode(encode([record(0, beat0, None, 10.0, 0.0), record(1, beat1, None, 10.0, 0.0)]))  # type: ignore[arg-type]
    assert isinstance(recs[0], RankRecord) and recs[0].data_dry == 5 and recs[1].data_dry is None
    ps = {r.rank: to_position(r, r.rank) for r in recs}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "loader-exhausted" and d.culprit_ranks == [0], d.reason
    assert "ran dry (StopIteration) after step 5" in d.reason and "barrier #11" in d.reason
    assert d.to_json()["positions"]["0"]["data_dry"] == 5
    fs = hang_findings({"diagnosis": d.to_json(), "detected_after_s": 4.0, "hang_timeout_s": 3.0})
    (hang,) = [f for f in fs if f.id == "hang"]
    assert hang.evidence["kind"] == "loader-exhausted" and "DataLoader ran out of batches" in hang.advice


def test_a_loader_that_ran_dry_at_an_earlier_step_is_no_evidence() -> None:
    # It drew batches again since (a new epoch): data_dry is cleared then; one left from an earlier step is stale.
    p0 = RankPosition(0, "in-collective", "data", 5, "barrier", "default_pg", 11, [], "hang.py:73", data_dry=3)
    d = diagnose_hang({0: p0, 1: _ddp(1)}, [0, 1])
    assert d.kind == "mismatch"

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

"""A rank whose data ran out first (hang-loader-exhausted-2r; docs/accuracy.md miss 6): the hang's kind says so,
not only the advice. Positions as the benchmark's run recorded them: rank 0 in the end-of-epoch barrier entered
from the data phase at step 5, rank 1 in step 5's backward (DDP's all-reduce) at the same sequence number."""

from __future__ import annotations

from ddpdoctor.findings.hang import DDP_BUCKETS, RankPosition, diagnose_hang, hang_findings


def _ddp(rank: int, step: int = 5) -> RankPosition:
    return RankPosition(rank, "in-collective", "backward", step, DDP_BUCKETS, "default_pg", 11, [], "_bench.py:56")


def test_a_rank_in_the_end_of_epoch_barrier_after_asking_for_a_batch_ran_out_of_data() -> None:
    ps = {0: RankPosition(0, "in-collective", "data", 5, "barrier", "default_pg", 11, [], "hang.py:73"), 1: _ddp(1)}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "out-of-data" and d.culprit_ranks == [0] and "left the training loop early" in d.reason
    (f,) = hang_findings({"diagnosis": d.to_json(), "detected_after_s": 4.0, "hang_timeout_s": 3.0})
    assert f.evidence["kind"] == "out-of-data" and "ran out of batches" in f.advice


def test_an_extra_collective_at_the_top_of_the_loop_is_still_a_mismatch() -> None:
    ps = {0: _ddp(0), 1: RankPosition(1, "in-collective", "data", 5, "broadcast", "default_pg", 11, [[3]], "t.py:86")}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "mismatch" and d.culprit_ranks == [1]

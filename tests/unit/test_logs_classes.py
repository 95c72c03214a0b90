"""Issue 27's classes of logs that are not in the real corpus as a whole (tests/fixtures/logs/real holds one or more
real logs for the others): watchdogs of two nodes that disagree on the op at one sequence number."""

from __future__ import annotations

from pathlib import Path

from ddpdoctor.logs.explain import explain_texts

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "logs"

_LINE = ("[rank{r}]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
         "operation timeout: WorkNCCL(SeqNum=7753, OpType={op}, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran "
         "for 600061 milliseconds before timing out.\n")


def _node(op: str, ranks: range) -> str:
    return "".join(_LINE.format(r=r, op=op) for r in ranks)


def test_two_nodes_watchdogs_disagree_on_the_op_is_a_collective_mismatch_when_each_numbers_its_ranks_from_0() -> None:
    found = explain_texts({"node0.log": _node("REDUCE", range(4)), "node1.log": _node("ALLREDUCE", range(4))})
    assert [f.id for f in found][:2] == ["collective-mismatch", "hang"], [(f.id, f.title) for f in found]
    mismatch = found[0]
    assert mismatch.evidence["sequence_number"] == 7753
    assert set(mismatch.evidence["collectives"]) == {"REDUCE (1024 elements)", "ALLREDUCE (1024 elements)"}
    assert "node0.log: rank 0" in mismatch.evidence["collectives"]["REDUCE (1024 elements)"]


def test_two_nodes_with_global_ranks_still_one_mismatch() -> None:
    found = explain_texts({"node0.log": _node("REDUCE", range(4)), "node1.log": _node("ALLREDUCE", range(4, 8))})
    assert found[0].id == "collective-mismatch" and sorted(found[0].ranks) == list(range(8))


def test_same_op_everywhere_is_a_hang_only() -> None:
    found = explain_texts({"node0.log": _node("ALLREDUCE", range(4)), "node1.log": _node("ALLREDUCE", range(4, 8))})
    assert "collective-mismatch" not in [f.id for f in found]


def test_the_real_wrapped_two_node_paste_with_the_other_nodes_op_line_is_a_collective_mismatch() -> None:
    # tests/fixtures/logs/real/watchdog_nodes_split_at_same_seq_wrapped_milabench269.log alone cannot say which op
    # cn-d003 ran at #2070 (hang, both readings); with cn-d003's watchdog line in the same wrapped form, it is a
    # mismatch and comes first, the hang after it.
    real = FIX / "real" / "watchdog_nodes_split_at_same_seq_wrapped_milabench269.log"
    text = "".join(ln + "\n" for ln in real.read_text().splitlines() if not ln.startswith("# "))
    other = ("dinov2-giant-nodes.cn-d003.nolog [stderr] [rank7]:[E909 09:55:29.974288000 ProcessGroupNCCL.cpp:607] "
             "[Rank 7] Watchdog caught collective operation timeout: \n"
             "WorkNCCL(SeqNum=2070, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600031 "
             "milliseconds before timing out.\n")
    alone = explain_texts({"milabench.log": text})
    assert [f.id for f in alone] == ["hang"] and alone[0].evidence["culprit_ranks"] == []
    assert alone[0].evidence["diverged"] == {"seq": 2070, "waiting": [8, 11, 12, 13, 14, 15], "ahead": [7],
                                             "ahead_to": 2082, "op": "REDUCE"}
    both = explain_texts({"milabench.log": text + other})
    assert [f.id for f in both][:2] == ["collective-mismatch", "hang"]
    assert both[0].evidence["collectives"]["7"]["op"] == "ALLREDUCE"

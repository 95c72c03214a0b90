"""Stack classes and rank ranges (ddpdoctor/job/grouping.py), on hand-made positions and stacks."""

from __future__ import annotations

from ddpdoctor.findings.hang import RankPosition
from ddpdoctor.job.grouping import group, main_thread, parse_ranges, rank_ranges, render, stack_key


def test_rank_ranges() -> None:
    assert rank_ranges([]) == "-"
    assert rank_ranges([5]) == "5"
    assert rank_ranges([3, 0, 1, 2, 2, 7, 9, 8]) == "0-3,7-9"
    everyone_but_512 = [r for r in range(1024) if r != 512]
    assert rank_ranges(everyone_but_512) == "0-511,513-1023"
    assert parse_ranges("0-511,513-1023") == everyone_but_512
    assert parse_ranges("-") == []


PYSPY = """Process {pid}: python train.py
Python v3.12.3 (/usr/bin/python3.12)

Thread {tid} (idle): "MainThread"
    allreduce (torch/distributed/distributed_c10d.py:2950)
    backward (torch/_tensor.py:626)
    <module> (train.py:40)
"""


def test_stacks_that_differ_only_in_ids_are_one_class() -> None:
    a = PYSPY.format(pid=111, tid="0x7F00AA")
    b = PYSPY.format(pid=222, tid="0x7F00BB")
    assert stack_key(a) == stack_key(b)


def test_groups_outliers_first_with_ranges_and_representative() -> None:
    n = 1024
    pos = {r: RankPosition(r, "in-collective", "backward", 6, "allreduce", "default_pg", 40, [], "train.py:40")
           for r in range(n)}
    pos[512] = RankPosition(512, "outside-collective", "data", 6, call_site="loader.py:77")
    stacks = {r: PYSPY.format(pid=1000 + r, tid=hex(0x7F0000 + r)) for r in range(n)}
    stacks[512] = 'Thread 0x1 (active): "MainThread"\n    __getitem__ (loader.py:77)\n'
    node_of = {r: r // 128 for r in range(n)}
    classes = group(pos, stacks, node_of)
    assert [c.count for c in classes] == [1, 1023]
    first, rest = classes
    assert first.ranges == "512" and first.nodes == [4] and "outside any collective at loader.py:77" in first.state
    assert rest.ranges == "0-511,513-1023" and rest.representative == 0
    assert "in allreduce #40 on default_pg at train.py:40, phase backward, step 6" == rest.state
    text = render(classes)
    assert text.splitlines()[0] == "2 class(es) of 1024 rank(s), outliers first:"
    assert "[1 rank(s): 512 on node(s) 4]" in text and "[1023 rank(s): 0-511,513-1023 on node(s) 0-7]" in text
    assert "__getitem__ (loader.py:77)" in text
    assert len(text.splitlines()) < 30
    js = rest.to_json()
    assert js["count"] == 1023 and js["ranks"] == "0-511,513-1023" and js["nodes"] == "0-7"


def test_different_stacks_same_state_split() -> None:
    pos = {r: RankPosition(r, "outside-collective", "forward", 3, call_site="m.py:1") for r in range(4)}
    stacks = {0: "a\n", 1: "a\n", 2: "b\n", 3: None}
    classes = group(pos, stacks)
    assert [(c.count, c.ranges) for c in classes] == [(1, "2"), (1, "3"), (2, "0-1")]


def test_long_stacks_are_cut_to_their_last_lines() -> None:
    pos = {0: RankPosition(0, "no-heartbeat")}
    text = render(group(pos, {0: "\n".join(f"line {i}" for i in range(50))}), stack_lines=5)
    assert "(45 earlier line(s))" in text and "line 49" in text and "line 44" not in text


def test_py_spy_dump_shows_the_main_thread_innermost_first() -> None:
    frames = "".join(f"    f{i} (m.py:{i})\n" for i in range(30))
    dump = f'Process 7: python\n\nThread 7 (idle): "MainThread"\n{frames}Thread 8 (idle): "ddpdoctor-heartbeat"\n    loop (h.py:1)\n'
    shown = main_thread(dump, 3)
    assert shown == ['Thread 7 (idle): "MainThread"', "    f0 (m.py:0)", "    f1 (m.py:1)", "    f2 (m.py:2)",
                     "    ... (27 outer frame(s))"]

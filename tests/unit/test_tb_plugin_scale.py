"""The TensorBoard tab at a job's scale, without a server: a 1,024-rank run (tests/big_job.py) is shown as the ranks
that matter and classes of alike ranks with ranges, as the terminal and the HTML report show it; its timeline
draws a handful of ranks and reads only their traces; any other ranks can be asked for, a bounded number."""

from __future__ import annotations

import pytest

from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS
from ddpdoctor.tensorboard_plugin.runs import load_report, parse_ranks, rank_groups, run_summary, timeline
from tests.big_job import RANKS, STRAGGLER, big_run


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return big_run(tmp_path_factory.mktemp("tb-scale") / "big")


def test_a_big_job_is_grouped_into_the_ranks_that_matter_and_classes(big):
    groups = rank_groups(load_report(big).sections)
    assert groups is not None and groups["all_ranks"] == RANKS
    rows = {(g["label"], g["ranks"]) for g in groups["rows"]}
    # tests/big_job.py: 513 is the straggler; 896-1023 are 10% slower; everyone else within 2% of the recorded
    # step, so the typical class is every other rank and the fastest is one of them (-2%: rank*37 % 9 == 0).
    assert ("straggler", "513") in rows
    assert ("typical", "0-512,514-895") in rows and ("5-15% slower", "896-1023") in rows
    fastest = next(g for g in groups["rows"] if g["label"] == "fastest")
    assert fastest["count"] == 1 and (fastest["shown_rank"] * 37) % 9 == 0
    assert len(groups["rows"]) <= 8
    # every rank is in a class: the classes' counts add up to the job
    assert sum(g["count"] for g in groups["rows"] if g["label"] not in ("straggler", "fastest", "slowest")) == RANKS


def test_few_ranks_are_not_grouped(tmp_path):
    assert rank_groups(load_report(big_run(tmp_path / "at-bound", ranks=MAX_RANK_ROWS)).sections) is None
    small = timeline(big_run(tmp_path / "small", ranks=4))
    assert small["groups"] is None and [r["rank"] for r in small["ranks"]] == [0, 1, 2, 3]


def test_the_timeline_draws_the_ranks_that_matter_and_reads_only_their_traces(big):
    data = timeline(big)
    shown = {g["shown_rank"] for g in data["groups"]["rows"]}
    assert {r["rank"] for r in data["ranks"]} == shown and STRAGGLER in shown
    assert data["traces_not_read"] == RANKS - len(shown)
    labels = {r["rank"]: r["label"] for r in data["ranks"]}
    assert labels[STRAGGLER].endswith("· straggler")
    assert any("typical: ranks 0-512,514-895 (895)" in v for v in labels.values())
    assert any("5-15% slower: ranks 896-1023 (128)" in v for v in labels.values())
    # real trace data for each drawn rank (the recorded gloo trace of its parity)
    names = data["names"]
    for rank in data["ranks"]:
        assert any(names[e[3]].startswith("ProfilerStep#") for t in rank["tracks"] for e in t["events"])


def test_other_ranks_are_drawn_on_request_a_bounded_number(big):
    data = timeline(big, parse_ranks("600-603,7"))
    assert [r["rank"] for r in data["ranks"]] == [7, 600, 601, 602, 603] and data["asked"] == [7, 600, 601, 602, 603]
    assert data["traces_not_read"] == RANKS - 5
    assert parse_ranks("0-999999999") == list(range(MAX_RANK_ROWS))  # never expanded past the bound
    assert parse_ranks(" 3, 3,1 ") == [3, 1]
    for bad in ("a", "5-3", "-1", "1-", "1e9", "0x10", "1" * 20):
        with pytest.raises(ValueError):
            parse_ranks(bad)


def test_the_run_list_counts_every_rank(big):
    row = run_summary("big", big)
    assert row["ranks"] == RANKS and row["has_traces"]


def test_scalars_of_a_big_job_are_the_ranks_that_matter_and_class_medians(big, tmp_path):
    import json
    import statistics

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    from ddpdoctor.renderers.tensorboard import write_scalars
    from ddpdoctor.reports.sections import PerfSection
    from tests.big_job import SLOW_CLASS, factor

    sections = json.loads((big / "report.json").read_text())
    written = write_scalars(PerfSection.from_json(sections), tmp_path / "scalars", wall_time=1_700_000_000.0)
    names = sorted(p.name for p in written)
    fastest = next(g["shown_rank"] for g in rank_groups(sections)["rows"] if g["label"] == "fastest")
    assert names == sorted([f"rank{STRAGGLER}", f"rank{fastest}", "class-typical", "class-5-15pct-slower",
                            "class-45pct-slower"])
    # the slower class's step time per step: the median over ranks 896-1023 of the recorded step x 1.10, by hand
    recorded = {r["rank"]: r for r in sections["ranks"]}
    step = recorded[0]["per_step"][0]["step"]
    want = statistics.median(next(s["dur_us"] for s in recorded[r]["per_step"] if s["step"] == step)
                             for r in SLOW_CLASS) / 1000
    assert abs(factor(900) - 1.10) < 1e-12
    acc = EventAccumulator(str(tmp_path / "scalars" / "class-5-15pct-slower"))
    acc.Reload()
    got = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors("ddpdoctor/step_time_ms")}
    assert abs(got[step] - want) < 1e-3 * want

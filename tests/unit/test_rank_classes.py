"""Ranks grouped for the views of big jobs (renderers/rank_classes.py): bands worked out by hand, classes that hold
every rank once, the ranks that matter kept as rows, and one screen of rows at 1,024 ranks."""

from __future__ import annotations

from typing import Any

from ddpdoctor.renderers.html import render_html
from ddpdoctor.renderers.rank_classes import MAX_RANK_ROWS, band, band_label, group_ranks
from ddpdoctor.report import Report


def _rank(r: int, step_us: float, comm_us: float = 400.0, steps: int = 3) -> dict[str, Any]:
    return {"rank": r, "device": "cpu", "steps": steps, "step_time_us": {"median": step_us, "p90": step_us},
            "compute_us": 3 * 500.0, "comm_us": comm_us, "overlap_us": 100.0, "overlap_pct": 25.0,
            "exposed_comm_us": comm_us - 100.0, "exposed_comm_pct": 10.0, "idle_us": 30.0, "data_wait_us": 0.0}


def test_bands_by_hand() -> None:
    # 100 us median: within 5% typical; 5-15% band 1; 15-25% band 2; ...; 45% and more band 5 (open-ended).
    assert [band(v, 100.0) for v in (95.0, 100.0, 105.0)] == [0, 0, 0]
    assert [band(v, 100.0) for v in (105.5, 114.9, 115.0, 124.9, 144.9, 145.0, 400.0)] == [1, 1, 2, 2, 4, 5, 5]
    assert [band(v, 100.0) for v in (94.0, 80.0, 10.0)] == [-1, -2, -5]
    assert band_label(0, False) == "typical" and band_label(2, False) == "15-25% slower"
    assert band_label(-5, False) == "45%+ faster" and band_label(1, True) == "5-15% more comm"


def test_few_ranks_are_not_grouped() -> None:
    assert group_ranks([_rank(r, 100.0) for r in range(MAX_RANK_ROWS)], []) is None


def test_1024_ranks_in_a_few_classes_and_the_ranks_that_matter() -> None:
    # 1,000 ranks at 100 us +-2 %, 20 ranks 20 % slower (a slow node), 4 ranks 30 % faster; rank 7 the straggler.
    ranks = [_rank(r, 98.0 + (r % 5)) for r in range(1000)]
    ranks += [_rank(r, 120.0) for r in range(1000, 1020)]
    ranks += [_rank(r, 70.0) for r in range(1020, 1024)]
    rows = group_ranks(ranks, [7])
    assert rows is not None and len(rows) <= 8
    singles = [(g.label, g.ranks) for g in rows if len(g.ranks) == 1 and g.label in ("straggler", "slowest", "fastest")]
    assert singles == [("straggler", [7]), ("slowest", [1000]), ("fastest", [1020])]
    classes = [g for g in rows if g.label not in ("straggler", "slowest", "fastest")]
    assert [(g.label, g.ranges) for g in classes] == [("25-35% faster", "1020-1023"), ("typical", "0-999"),
                                                    ("15-25% slower", "1000-1019")]
    assert sorted(r for g in classes for r in g.ranks) == list(range(1024))  # every rank once
    typical = classes[1].row
    assert typical["step_time_us"]["median"] == 100.0 and typical["step_time_us"]["min"] == 98.0
    assert typical["step_time_us"]["max"] == 102.0 and typical["comm_us"] == 400.0
    assert classes[1].short_ranges() == "0-999 (1000)"


def test_interleaved_ranks_are_cut_with_their_count() -> None:
    ranks = [_rank(r, 130.0 if r % 4 == 0 else 100.0) for r in range(200)]
    rows = group_ranks(ranks, [])
    assert rows is not None
    slow = next(g for g in rows if g.label == "25-35% slower")
    text = slow.short_ranges(16)
    assert text.startswith("0,4,8,") and text.endswith(",… (50)") and len(text) <= 16 + len(" (50)")


def test_stepless_ranks_grouped_by_communication() -> None:
    ranks = [_rank(r, 0.0, comm_us=1000.0 if r != 5 else 2000.0, steps=0) for r in range(64)]
    for r in ranks:
        r["step_time_us"] = {"median": None}
    rows = group_ranks(ranks, [])
    assert rows is not None
    assert (rows[0].label, rows[0].ranks) == ("most communication", [5])
    assert [g.label for g in rows[2:]] == ["typical", "45%+ more comm"]


def test_html_groups_big_jobs_and_folds_every_rank_away() -> None:
    ranks = [_rank(r, 100.0) for r in range(300)]
    html = render_html(Report(command="analyze", sections={"ranks": ranks, "stragglers": {"ranks": [], "evidence": {}}}))
    assert "300 ranks: ranks grouped by median step time" in html
    assert "<details><summary>every rank (300 rows)</summary>" in html
    grouped = html.split("<details>")[0]
    assert grouped.count("0-299 (300): typical") == 1

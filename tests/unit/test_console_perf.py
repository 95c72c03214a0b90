"""The terminal summary: per-rank numbers, stragglers and the top advice, readable at 80 columns."""

from __future__ import annotations

import re

from rich.console import Console

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.renderers.console import render
from ddpdoctor.renderers.console_perf import ms, render_perf_sections
from ddpdoctor.report import Report
from tests.views_fixtures import EVIL, evil_report, findings, sections


def _row(text: str, *first: str) -> str:
    """The table line whose first cells are ``first`` (cells are separated by spaces)."""
    return next(line for line in text.splitlines() if line.split()[: len(first)] == list(first))


def _text(report: Report, verbose: bool = False, width: int = 80) -> str:
    out = Console(record=True, width=width, color_system=None)
    render(report, sections=render_perf_sections, verbose=verbose, out=out)
    return out.export_text()


def test_summary_numbers_worked_out_by_hand():
    text = _text(Report(command="analyze", sections=sections(), findings=findings()))
    # tests/fixtures/views/README.md: rank 0 median step 40 ms; over its 3 steps comm 72 ms (24 ms a step), 43.06 %
    # overlapped, 41 ms exposed (13.67 a step, 32.9 % of 124.6 ms of steps), compute 71 (23.67), idle 12.6 (4.20),
    # data wait 1.111 (0.37); rank 1 (straggler) made the others wait 10.6 ms.
    row0 = _row(text, "0")
    for cell in ("40.00", "23.67", "24.00", "43.1%", "13.67 (33%)", "4.20", "0.37"):
        assert cell in row0, (cell, row0)
    assert "1*" in text and "* straggler" in text
    assert "rank 1 (others waited 10.60 ms)" in text
    # The top advice is the error finding's, and it comes before the findings table.
    assert "Top advice (straggler.rank): Look at rank 1's host" in text
    assert text.index("Top advice") < text.index("Findings")
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "Per rank (ms per step)" in text and "step: median; others: mean per step, 3 recorded steps" in text
    assert "overlap: share of communication time hidden behind compute" in text


def test_findings_wrap_under_a_hanging_indent_with_measured_value_and_threshold():
    long = Finding("step-time-variance", Severity.WARNING, "Step times vary by more than 20% between steps " * 3,
                   [0, 1], {"by_rank": {"0": {"cv": 0.3123, "median_ms": 40.2}, "1": {"cv": 0.251, "median_ms": 41.0}},
                            "threshold_cv": 0.2}, "Look at the slowest step in the timeline " * 4)
    text = _text(Report(command="analyze", findings=[long]))
    lines = text[text.index("Findings"):].splitlines()[1:]
    assert lines[0].startswith("warning step-time-variance")
    # every continuation line starts under the title, 8 columns in
    assert all(line.startswith(" " * 8) and line[8] != " " for line in lines[1:] if line.strip())
    joined = " ".join(line.strip() for line in lines)
    assert "cv: 0.3123" in joined and "threshold_cv=0.2" in joined and "…" not in joined
    assert max(len(line) for line in text.splitlines()) <= 80
    verbose = _text(Report(command="analyze", findings=[long]), verbose=True)
    assert '"median_ms": 41.0' in verbose.replace("\n", "").replace("        ", "")


def test_verbose_adds_steps_and_collectives():
    text = _text(Report(command="analyze", sections=sections(), findings=findings()), verbose=True, width=140)
    assert "Per step (ms, each recorded step)" in text and "Collective calls" in text
    assert "Collectives by op" in text and "totals over the recorded steps" in text
    # rank 0 step 4: 54 ms, 34 ms of comm of which 11 ms overlapped (32.4 %), 23 ms exposed
    step4 = _row(text, "0", "4")
    for cell in ("54.00", "34.00", "32.4%", "23.00"):
        assert cell in step4, (cell, step4)


def test_no_comm_unknown_and_markup():
    s = sections()
    s["ranks"][0].update(comm_us=0.0, overlap_pct=None)
    del s["ranks"][1]["comm_us"]
    s["ranks"][1]["overlap_pct"] = None
    text = _text(Report(command="analyze", sections=s))
    assert "no comm" in _row(text, "0") and _row(text, "1*").split()[3:5] == ["-", "-"]
    assert "nan" not in text.lower()
    # rich markup in trace-derived strings is printed literally, not interpreted
    evil = evil_report()
    evil.findings.append(Finding("x", Severity.WARNING, "t", [0], {}, "[red]boom[/red] " + EVIL))
    text = _text(evil, verbose=True, width=200)
    assert "[red]boom[/red]" in text


def test_many_ranks_fit_a_screen():
    s = sections()
    base = s["ranks"][0]
    s["ranks"] = [dict(base, rank=r, step_time_us={"median": 1000.0 + r}) for r in range(1000)]
    s["stragglers"] = {"ranks": [3], "evidence": {}}
    text = _text(Report(command="analyze", sections=s), width=100)
    rows = [line for line in text.splitlines() if re.match(r"^\s*\d[\d,\-…]*( \(\d+\))?\s+\d", line)]
    # Classes of alike ranks with ranges (renderers/rank_classes.py) and the ranks that matter: one screen.
    assert len(rows) <= 10 and len(text.splitlines()) <= 40
    assert "--json has every rank" in text
    labels = [r.split()[0] for r in rows]
    assert labels[:3] == ["3", "999", "0"]  # the straggler, the slowest, the fastest
    assert "straggler" in text and "slowest" in text and "fastest" in text and "typical" in text
    counts = [int(m.group(1)) for r in rows[3:] if (m := re.search(r"\((\d+)\)", r))]
    assert sum(counts) == 1000  # the classes hold every rank once


def test_ms_never_prints_nan():
    assert ms(float("nan")) == "-" and ms(None) == "-" and ms(1500.0) == "1.50"

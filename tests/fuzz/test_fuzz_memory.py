"""`analyze` of a long trace holds its columns, never its events, its bytes or its report's text whole (issue 40:
200,000 steps peaked at 2 GB; tests/fuzz/README.md). Peak traced memory (tracemalloc: the same figure on any
machine, loaded or not) at two sizes, per step, against a budget far from both what it is and what holding
everything cost. The ranges a big trace is read in are made small (traces/chunks.py), so that traces of a few MB
take the path a 200 MB one takes."""

from __future__ import annotations

import contextlib
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.commands._common import emit
from ddpdoctor.reports.analyze import assemble
from ddpdoctor.safe_io import dumps_json
from ddpdoctor.traces import chunks, split
from tests.fuzz.long_inputs import write_many_steps_trace

STEPS = 5_000  # and twice as many: traces of 5.5 and 11 MB

pytestmark = pytest.mark.xdist_group("fuzz_memory")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    d = tmp_path_factory.mktemp("memory")
    return {n: write_many_steps_trace(d / f"rank0.{n}.pt.trace.json", n) for n in (STEPS, 2 * STEPS)}


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1 << 18)
    monkeypatch.setattr(chunks, "MIN_CHUNKED_BYTES", 1 << 19)


def traced_peak(fn: Callable[[], Any]) -> int:
    """The most memory Python held at once (above what it held before) while fn ran."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reading_a_long_trace_holds_its_columns_not_its_events(traces: dict[int, Path]) -> None:
    # Measured per step: the columns 2.1 KB, the peak 2.4 KB (one range's events on top); the whole file read and
    # decoded at once (the one-pass reader: its bytes, its 8 events a step as objects, then the columns) 5.6 KB.
    peaks = {n: traced_peak(lambda p=p: split.load_trace(p, workers=2)) for n, p in traces.items()}
    per_step = (peaks[2 * STEPS] - peaks[STEPS]) / STEPS
    assert per_step < 3_500, (peaks, per_step)
    assert peaks[2 * STEPS] < 3_500 * 2 * STEPS + (4 << 20), peaks  # (and no file-sized buffer on the way)


def test_the_json_report_is_written_in_pieces(traces: dict[int, Path]) -> None:
    # Measured: writing a report of 7.7 / 15.4 MB of text peaks at ~7 MB both times (one batch of entries); the
    # text whole, compact then indented, took ~2.5 times the text.
    peaks, texts = {}, {}
    for n, p in traces.items():
        report = assemble(analyze_paths([p]))
        texts[n] = len(dumps_json(report.to_json(), indent=2))

        def write(report: Any = report) -> None:
            with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), pytest.raises(SystemExit):
                emit(report, as_json=True)

        peaks[n] = traced_peak(write)
    growth = peaks[2 * STEPS] - peaks[STEPS]
    assert growth < 0.1 * (texts[2 * STEPS] - texts[STEPS]), (peaks, texts)
    assert peaks[2 * STEPS] < 0.75 * texts[2 * STEPS], (peaks, texts)

"""write_outputs: the files a performance report leaves behind (HTML, TensorBoard scalars, merged trace)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from ddpdoctor.errors import BadInput
from ddpdoctor.renderers.outputs import write_outputs
from ddpdoctor.renderers.tensorboard import write_scalars
from ddpdoctor.report import Report
from ddpdoctor.reports.sections import PerfSection
from tests.views_fixtures import FIXTURES, findings, sections

TRACES = sorted((FIXTURES / "traces").glob("*.pt.trace.json.gz"))


def _scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """Read the event file back with tensorboard's own reader (the writer stores scalars as tensors)."""
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)}
            for tag in acc.Tags()["tensors"]}


def test_run_dir_gets_html_and_scalars(tmp_path):
    run = tmp_path / "run"
    extra = tmp_path / "out" / "r.html"
    merged = tmp_path / "out" / "merged.json.gz"
    s = sections()
    s["clock_offsets_us"] = {"0": 0.0, "1": 40.0}
    written = write_outputs(Report(command="analyze", sections=s, findings=findings()), run, extra, merged, TRACES)
    assert set(written) == {run / "report.html", extra, run / "scalars" / "rank0", run / "scalars" / "rank1", merged}
    assert "Rank 1 arrives last" in (run / "report.html").read_text()
    rank0 = _scalars(run / "scalars" / "rank0")
    # hand-worked numbers, tests/fixtures/views/README.md
    assert rank0["ddpdoctor/step_time_ms"] == pytest.approx({3: 40.0, 4: 54.0, 5: 30.6})
    assert rank0["ddpdoctor/overlap_pct"][3] == pytest.approx(47.83, abs=1e-3)
    merged_events = json.loads(gzip.decompress(merged.read_bytes()))
    assert merged_events["otherData"]["ddpdoctor"]["clock_offsets_us"] == {"0": 0.0, "1": 40.0}


def test_rewriting_scalars_replaces_them_and_skips_null(tmp_path):
    s = sections()
    s["ranks"][0]["per_step"][0].update(comm_us=0.0, overlap_pct=None)
    write_scalars(PerfSection.from_json(s), tmp_path)
    write_scalars(PerfSection.from_json(s), tmp_path)
    files = list((tmp_path / "rank0").glob("events.out.tfevents.*"))
    assert len(files) == 1
    rank0 = _scalars(tmp_path / "rank0")
    assert set(rank0["ddpdoctor/overlap_pct"]) == {4, 5}  # step 3 had no communication: no fake 0
    assert rank0["ddpdoctor/comm_ms"][3] == 0.0


def test_unwritable_targets_are_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BadInput, match="cannot write the HTML report"):
        write_outputs(Report(command="analyze", sections=sections()), None, blocker / "r.html", None, [])
    with pytest.raises(BadInput, match="merged trace"):
        write_outputs(Report(command="analyze", sections=sections()), None, None, blocker / "m.json.gz", TRACES)
    with pytest.raises(BadInput, match="no traces"):
        write_outputs(Report(command="analyze", sections=sections()), None, None, tmp_path / "m.json.gz", [])

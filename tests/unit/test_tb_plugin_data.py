"""The TensorBoard tab's data, without a server: run discovery under a log dir, run summaries, and the all-ranks
timeline on rank 0's clock."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ddpdoctor.analyses.pipeline import analyze_paths
from ddpdoctor.reports.analyze import assemble as report_for
from ddpdoctor.tensorboard_plugin.runs import find_runs, run_summary, timeline

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "analyze" / "gloo_2rank_mlp"


def make_run(dest: Path, offsets: dict[str, float] | None = None) -> Path:
    """A run directory with traces and the report.json `profile` would have written."""
    shutil.copytree(FIXTURE, dest)
    report = report_for(analyze_paths([dest]))
    data = report.to_json()
    if offsets is not None:
        data["clock_offsets_us"] = offsets
    (dest / "report.json").write_text(json.dumps(data))
    return dest


def test_runs_are_found_under_the_logdir_and_not_inside_runs(tmp_path):
    make_run(tmp_path / "logs" / "a")
    make_run(tmp_path / "logs" / "team" / "b")
    (tmp_path / "logs" / "empty").mkdir()
    (tmp_path / "logs" / ".hidden").mkdir()
    runs = find_runs(tmp_path / "logs")
    assert list(runs) == ["a", "team/b"]
    row = run_summary("a", runs["a"])
    assert row["status"] in ("ok", "warning", "error") and row["ranks"] == 2 and row["has_traces"]
    assert row["why"]


def test_timeline_has_every_rank_on_rank0s_clock(tmp_path):
    run = make_run(tmp_path / "r", offsets={"0": 0.0, "1": 500.0})
    plain = make_run(tmp_path / "p", offsets={"0": 0.0, "1": 0.0})
    shifted, unshifted = timeline(run), timeline(plain)
    assert [r["rank"] for r in shifted["ranks"]] == [0, 1]
    assert shifted["events"] == unshifted["events"] > 1000 and not shifted["truncated"]

    def first_step(data, rank):
        names = data["names"]
        r = next(x for x in data["ranks"] if x["rank"] == rank)
        return min(e[0] for t in r["tracks"] for e in t["events"] if names[e[3]].startswith("ProfilerStep#"))

    # rank 1 moved 500 us earlier relative to rank 0 (its clock ran 500 us ahead)
    delta = (first_step(shifted, 1) - first_step(shifted, 0)) - (first_step(unshifted, 1) - first_step(unshifted, 0))
    assert abs(delta + 500.0) < 1e-3
    # nesting: a child op sits one level below the step that contains it
    track = shifted["ranks"][0]["tracks"][0]
    assert track["depth"] >= 2 and any(e[2] >= 1 for e in track["events"])

"""Real traces without ProfilerStep (the profiler used without a schedule; serving and RL frameworks) are traces:
analyze reports the whole-trace figures, says that per-step figures need steps and how to get them, and keeps every
per-step rule quiet. Inputs: the bundled and the ../shared real traces with their ProfilerStep events stripped
(no real step-less trace is among them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analyses.pipeline import AnalyzeOptions, analyze_paths
from ddpdoctor.reports.analyze import assemble as report_for
from ddpdoctor.traces import synthetic
from tests.conftest import SAMPLE_RUN, run_cli, shared_path


def _stripped(src: list[Path], dest: Path) -> Path:
    for p in src:
        synthetic.write(synthetic.strip_steps(synthetic.load_doc(p)), dest / p.name)
    return dest


def _sample() -> list[Path]:
    return sorted((SAMPLE_RUN / "traces").glob("rank*.pt.trace.json.gz"))


def test_stepless_sample_gives_whole_trace_figures_and_no_per_step_rule(tmp_path: Path) -> None:
    with_steps = analyze_paths(_sample(), AnalyzeOptions(workers=1))
    folder = _stripped(_sample(), tmp_path / "t")
    a = analyze_paths([folder], AnalyzeOptions(workers=1))
    rep = report_for(a)
    assert [r.steps for r in a.ranks] == [0, 0]
    # Whole-trace figures do not depend on steps: the same as those of the trace with its steps.
    for got, ref in zip(a.ranks, with_steps.ranks, strict=True):
        assert got.comm_us == pytest.approx(ref.comm_us) and got.overlap_us == pytest.approx(ref.overlap_us)
        assert got.compute_us == pytest.approx(ref.compute_us) and got.exposed_comm_pct is None
    assert len(a.calls) == len(with_steps.calls) and len(a.matched) == len(with_steps.matched) > 0
    # One finding, info, with the whole-trace overlap; no per-step rule speaks.
    assert [(f.id, f.severity.value) for f in rep.findings] == [("no-profiler-steps", "info")]
    f = rep.findings[0]
    comm = sum(r.comm_us for r in a.ranks)
    assert f.evidence["overlap_pct"] == round(100 * sum(r.overlap_us for r in a.ranks) / comm, 1)
    assert f.evidence["matched_collectives"] == len(a.matched)
    assert "prof.step()" in (f.advice or "")
    assert any("no ProfilerStep in any trace" in n for n in rep.notes)


def test_stepless_cli_is_not_bad_input(tmp_path: Path) -> None:
    folder = _stripped(_sample(), tmp_path / "t")
    r = run_cli("analyze", str(folder), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [f["id"] for f in doc["findings"]] == ["no-profiler-steps"]
    text = run_cli("analyze", str(folder))
    assert text.returncode == 0 and "whole trace" in text.stdout


def test_stepless_straggler_named_by_matched_collectives(tmp_path: Path) -> None:
    sources = [synthetic.strip_steps(synthetic.load_doc(p)) for p in _sample()]
    synthetic.write_job(sources, 4, tmp_path / "job", slow_rank=2, late_us=3000.0)
    rep = report_for(analyze_paths([tmp_path / "job"], AnalyzeOptions(workers=1)))
    f = {x.id: x for x in rep.findings}["no-profiler-steps"]
    assert f.evidence["last_rank"] == 2 and f.evidence["clear_majority"] is True
    assert f.evidence["last_in"] == f.evidence["matched_collectives"]
    assert "rank 2 arrived last" in f.title
    assert {x.id for x in rep.findings} == {"no-profiler-steps"}  # no per-step straggler claim without steps


def test_not_a_trace_is_still_bad_input(tmp_path: Path) -> None:
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"hello": 1}))
    r = run_cli("analyze", str(p))
    assert r.returncode == 2 and "not a PyTorch profiler trace" in r.stderr


# HTA 0.5.0's overlap over every kernel of the file (../shared/traces/README.md, "all steps" column).
SHARED_ALL_STEPS = [
    (("a100_8gpu_rank3", "control.json.gz"), {3: 46.24}),
    (("sampled_2rank", "sampled_rank-0.json.gz"), {0: 14.95}),
    (("sampled_2rank", "sampled_rank-1.json.gz"), {1: 19.93}),
]


@pytest.mark.shared
@pytest.mark.parametrize(("parts", "expect"), SHARED_ALL_STEPS)
def test_stepless_real_gpu_traces_overlap_matches_hta_all_steps(tmp_path: Path, parts: tuple[str, str],
                                                                 expect: dict[int, float]) -> None:
    src = shared_path("traces", *parts)
    folder = _stripped([src], tmp_path / "t")
    a = analyze_paths([folder], AnalyzeOptions(workers=1))
    rep = report_for(a)
    got: dict[int, Any] = {r.rank: r.overlap_pct for r in a.ranks}
    for rank, pct in expect.items():
        assert got[rank] == pytest.approx(pct, abs=0.05)
    assert [f.id for f in rep.findings] == ["no-profiler-steps"]

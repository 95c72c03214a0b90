"""`diff` on hand-built runs: the worked example of docs/diff.md checked number by number, noise that is not a
regression, the bucket layout, what else changed, and the bad-input lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.analyses.diff import MIN_EFFECT_PCT, RESOURCES, diff, step_parts
from ddpdoctor.analyses.diff_changes import config_changes, facts
from ddpdoctor.analyses.results import Analysis, StepMetrics
from ddpdoctor.commands.diff import command as diff_command
from ddpdoctor.findings.diff import diff_findings
from ddpdoctor.rundir.schema import DDPModule, Manifest, RankEnd
from tests.unit.analysis_builders import analysis, rank, stragglers

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "analyze" / "gloo_2rank_mlp"
MS = 1000.0


def st(n: int, *, dur: float, data: float, idle: float, exposed: float, bwd: tuple[float, float]) -> StepMetrics:
    """One step in ms (converted to µs), starting at 0; compute_us is what the trace would hold (not read by diff)."""
    return StepMetrics(step=n, start_us=0.0, dur_us=dur * MS, compute_us=0.0, comm_us=exposed * MS, overlap_us=0.0,
                       overlap_pct=0.0, exposed_comm_us=exposed * MS, idle_us=idle * MS, backward_start_us=bwd[0] * MS,
                       backward_end_us=bwd[1] * MS, comm_in_backward_us=0.0, data_wait_us=data * MS)


# The worked example of docs/diff.md: 2 ranks, 4 steps a side; steps alternate 0.1 ms around their mean (in compute).
JITTER = (-0.1, 0.1, -0.1, 0.1)


def base_run() -> Analysis:
    ranks = [rank(r, [st(i, dur=10 + j, data=1, idle=1.5, exposed=2, bwd=(4, 8)) for i, j in enumerate(JITTER)])
             for r in (0, 1)]
    return analysis(ranks)


def new_run() -> Analysis:
    r0 = rank(0, [st(i, dur=13 + j, data=1, idle=1.5, exposed=5, bwd=(4, 8)) for i, j in enumerate(JITTER)])
    r1 = rank(1, [st(i, dur=13 + j, data=4, idle=4.5, exposed=2, bwd=(7, 11)) for i, j in enumerate(JITTER)])
    return analysis([r0, r1], stragglers=stragglers([1], 3 * MS, {1: 4 * 3 * MS}, {}))


def test_step_parts_sum_to_the_step():
    p = step_parts(st(0, dur=10, data=1, idle=1.5, exposed=2, bwd=(4, 8)))
    assert p.parts["data_wait"] == 1 * MS and p.parts["idle"] == 0.5 * MS and p.parts["exposed_comm"] == 2 * MS
    assert p.parts["compute"] == 6.5 * MS
    assert sum(p.parts[k] or 0 for k in RESOURCES) == p.dur_us
    assert (p.parts["data"], p.parts["forward"], p.parts["backward"], p.parts["optimizer"]) == (1e3, 3e3, 4e3, 2e3)


def test_worked_example_by_hand():
    d = diff(base_run(), new_run())
    assert d.step.base_us == pytest.approx(10 * MS) and d.step.new_us == pytest.approx(13 * MS)
    assert d.step.change.value == pytest.approx(3 * MS)
    assert d.step.pct_of_step == 30.0
    # minimum effect: 5% of the 10 ms base step (2 pooled sd = 2 * 0.1155 ms is smaller)
    assert d.step.min_effect_us == pytest.approx(MIN_EFFECT_PCT / 100 * 10 * MS)
    assert d.step.significant
    comp = {(c.component, c.rank): c.delta for c in d.components}
    assert comp[("data_wait", 1)].change.value == pytest.approx(3 * MS)
    assert comp[("data_wait", None)].change.value == pytest.approx(1.5 * MS)  # the job: mean of ranks, (1+4)/2 - 1
    assert comp[("exposed_comm", 0)].change.value == pytest.approx(3 * MS)
    assert comp[("optimizer", 0)].change.value == pytest.approx(3 * MS)
    assert comp[("idle", 1)].change.value == pytest.approx(0.0)  # the wait for data is counted once
    assert not comp[("compute", 0)].significant and not comp[("backward", 1)].significant
    top = [(c.component, c.ranks, c.waiting_for) for c in d.contributors]
    assert top == [("data_wait", [1], []), ("exposed_comm", [0], [1]), ("optimizer", [0], [])]
    assert d.composition["base"]["step"] == pytest.approx(10 * MS)
    assert d.composition["new"]["data_wait"] == pytest.approx(2.5 * MS)


def test_worked_example_finding():
    [f] = diff_findings(diff(base_run(), new_run(), labels=("base", "new")))
    assert f.id == "diff-step-slower" and f.severity.value == "warning"
    assert f.evidence["cost_ms_per_step"] == 3.0 and f.evidence["cost_pct_of_step"] == 30.0
    assert f.title.startswith("Step time +3.0 ms (+30.0%) against base: data wait on rank 1 +3.0 ms;")
    assert "exposed communication on rank 0 +3.0 ms (waiting for rank 1)" in f.title
    assert f.ranks == [0, 1]


def test_faster_is_info():
    [f] = diff_findings(diff(new_run(), base_run()))
    assert f.id == "diff-step-faster" and f.severity.value == "info"


def test_identical_runs_are_quiet():
    d = diff(base_run(), base_run())
    assert not d.step.significant and not d.contributors and diff_findings(d) == []


def test_a_change_within_the_runs_spread_is_not_a_regression():
    """+1 ms on a 10 ms step whose steps spread ±2 ms: over the 5% floor, interval above 0, but under 2 sd."""
    wide = (-2.0, 2.0, -2.0, 2.0, -2.0, 2.0, -2.0, 2.0)
    b = analysis([rank(r, [st(i, dur=10 + j, data=1, idle=1, exposed=2, bwd=(4, 8)) for i, j in enumerate(wide)])
                  for r in (0, 1)])
    n = analysis([rank(r, [st(i, dur=11 + j, data=1, idle=1, exposed=2, bwd=(4, 8)) for i, j in enumerate(wide)])
                  for r in (0, 1)])
    d = diff(b, n)
    assert not d.step.significant and d.step.min_effect_us > 1 * MS
    assert [f.id for f in diff_findings(d)] == ["diff-not-measurable"]
    assert all(f.severity.value == "info" for f in diff_findings(d))


def _manifest(cap: float, sizes: list[int], **over: object) -> Manifest:
    m = Manifest(world_size=2, hosts=["a"], backend="gloo", script="train.py", script_sha256="aa",
                 script_args=["--lr", "1"], versions={"torch": "2.13.0"},
                 env={"NCCL_ALGO": "Ring", "MASTER_PORT": "1234"}, ranks=[RankEnd(rank=0, host_cpus=8)],
                 ddp_modules={0: [DDPModule(bucket_cap_mb=cap, buckets=[])]})
    for k, v in over.items():
        setattr(m, k, v)
    return m


def test_what_else_changed_names_facts_not_ports():
    b = _manifest(25.0, [], host_load=1.0)
    n = _manifest(1.0, [], env={"NCCL_ALGO": "Tree", "MASTER_PORT": "999"}, script_sha256="bb", host_load=1.5)
    changes = {c.key: c for c in config_changes(facts(b), facts(n))}
    assert set(changes) == {"ddp.bucket_cap_mb", "env.NCCL_ALGO", "script.sha256"}  # port and load drift left out
    assert "exposed_comm" in changes["env.NCCL_ALGO"].explains and "buckets" in changes["ddp.bucket_cap_mb"].explains
    assert config_changes(facts(b), facts(b)) == []
    assert facts(None) == {}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(diff_command, list(args))
    return res.exit_code, res.output


def test_same_recorded_run_twice_is_ok_and_documented(tmp_path):
    code, out = _cli(str(FIXTURE), str(FIXTURE), "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["command"] == "diff" and report["status"] == "ok" and report["findings"] == []
    d = report["diff"]
    assert d["step"]["delta_ms"]["value"] == 0.0 and d["changes"] == []
    code, out = _cli(str(FIXTURE), str(FIXTURE), "--html", str(tmp_path / "d.html"))
    assert code == 0 and "<svg" in (tmp_path / "d.html").read_text()


def test_bad_input_one_line_exit_2(tmp_path):
    code, out = _cli(str(FIXTURE), str(tmp_path / "missing"))
    assert code == 2 and "no such file or directory" in out and len(out.strip().splitlines()) == 1


def test_a_failed_run_is_bad_input(tmp_path):
    import shutil

    failed = tmp_path / "failed"
    shutil.copytree(FIXTURE, failed)
    m = json.loads((failed / "manifest.json").read_text())
    m["exit_code"] = 1
    (failed / "manifest.json").write_text(json.dumps(m))
    code, out = _cli(str(FIXTURE), str(failed))
    assert code == 2 and "the new run failed (exit code 1)" in out and len(out.strip().splitlines()) == 1


def test_every_key_of_diff_json_is_documented():
    from tests.unit.test_json_doc import _documented, _keys

    sample = ROOT / "sample_traces" / "mlp_gloo_2rank"
    code, out = _cli(str(sample), str(FIXTURE), "--json")
    assert code in (0, 1), out
    report = json.loads(out)
    assert report["findings"] and report["diff"]["buckets"]["rows"] and report["diff"]["changes"]
    printed = {k for k in _keys(report) if not k.isdigit()} - {"evidence"}
    missing = printed - _documented()
    assert not missing, f"keys printed by diff --json but not in docs/json.md: {sorted(missing)}"


def _raw(events: list[tuple[str, str, float, float]]):
    from ddpdoctor.traces.loader import Event, RawTrace

    return RawTrace("t.json", [Event(ph="X", name=n, cat=c, pid=1, tid=1 if c != "kernel" else 7, ts=ts, dur=dur)
                               for n, c, ts, dur in events], None, None)


def test_operator_self_time_per_step_by_hand():
    from ddpdoctor.analyses.diff_ops import op_steps

    ops = op_steps(_raw([("ProfilerStep#1", "user_annotation", 0, 100), ("A", "cpu_op", 10, 50),
                         ("B", "cpu_op", 20, 20), ("K", "kernel", 50, 30), ("ProfilerStep#2", "user_annotation", 100, 100),
                         ("A", "cpu_op", 110, 20)]), rank=0)
    assert ops.steps == [1, 2]
    assert ops.per_step == {"cpu:A": {1: 30.0, 2: 20.0}, "cpu:B": {1: 20.0}, "gpu:K": {1: 30.0}}


def test_operators_that_matter_to_the_step():
    from ddpdoctor.analyses.diff_ops import OpSteps, op_deltas

    steps = [1, 2, 3, 4]
    base = [OpSteps(0, steps, {"cpu:slow": {s: 1000.0 + 10 * (s % 2) for s in steps},
                               "cpu:tiny": {s: 50.0 for s in steps}})]
    new = [OpSteps(0, steps, {"cpu:slow": {s: 4000.0 + 10 * (s % 2) for s in steps},
                              "cpu:tiny": {s: 150.0 for s in steps}})]  # tripled, but 0.1 ms: under the 0.5 ms floor
    [o] = op_deltas(base, new, base_step_us=10 * MS, floor_us=0.5 * MS)
    assert (o.name, o.kind, o.rank) == ("slow", "cpu", 0) and o.delta.change.value == pytest.approx(3 * MS)


def test_terminal_view_is_one_screen():
    from rich.console import Console

    from ddpdoctor.renderers.console import render
    from ddpdoctor.renderers.diff_console import render_diff_section
    from ddpdoctor.report import Report

    d = diff(base_run(), new_run(), config_changes(facts(_manifest(25.0, [])), facts(_manifest(1.0, []))),
             labels=("runs/base", "runs/new"))
    from ddpdoctor.reports.sections import DiffSection

    report = Report("diff", parts=[DiffSection(d.to_json())], findings=diff_findings(d))
    out = Console(record=True, width=120, highlight=False)
    render(report, sections=render_diff_section, out=out)
    text = out.export_text()
    lines = text.splitlines()
    assert len(lines) <= 40, text
    assert "step time 10.00 ms -> 13.00 ms: +3.00 ms" in lines[1]
    assert "data wait (resource) on rank(s) 1" in text and "waiting for rank 1" in text
    assert "ddp.bucket_cap_mb" in text and "plausibly related: ddp.bucket_cap_mb" in text
    assert text.index("data wait (resource)") < text.index("exposed comm (resource)") < text.index("what else changed")


def test_topology_facts_are_compared_where_recorded():
    b = facts(_manifest(25.0, []), {"inter_node_transport": ["NET/IB"], "gdr": True, "gdr_evidence": "x"})
    n = facts(_manifest(25.0, []), {"inter_node_transport": ["NET/Socket"], "gdr": False, "gdr_evidence": "y"})
    changes = {c.key: c for c in config_changes(b, n)}
    assert set(changes) == {"topology.inter_node_transport", "topology.gdr"}
    assert changes["topology.inter_node_transport"].new == "NET/Socket"
    assert "exposed_comm" in changes["topology.gdr"].explains


def test_exposed_comm_split_is_used_where_the_analysis_carries_it():
    """Issue 28's split (Analysis.comm_split: per rank, the exposed wait for a late peer per step): the diff adds
    comm_wait and comm_transfer (= exposed - wait); the worked example's +3 ms on rank 0 is all waiting."""
    from types import SimpleNamespace

    base, new = base_run(), new_run()
    base.comm_split = [SimpleNamespace(rank=r, wait_by_step={}) for r in (0, 1)]  # type: ignore[attr-defined]
    new.comm_split = [SimpleNamespace(rank=0, wait_by_step={i: 3 * MS for i in range(4)}),  # type: ignore[attr-defined]
                      SimpleNamespace(rank=1, wait_by_step={})]
    d = diff(base, new)
    assert d.comm_split
    comp = {(c.component, c.rank): c.delta for c in d.components}
    assert comp[("comm_wait", 0)].change.value == pytest.approx(3 * MS) and comp[("comm_wait", 0)].significant
    assert comp[("comm_transfer", 0)].change.value == pytest.approx(0.0)
    assert comp[("comm_transfer", 0)].base_us == pytest.approx(2 * MS)
    assert any(c.component == "comm_wait" and c.waiting_for == [1] for c in d.contributors)
    assert not diff(base_run(), new_run()).comm_split  # without the split: no such parts

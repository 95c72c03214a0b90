"""`ddpdoctor tune`'s rules: which variants are measured and why the others are skipped, `--try` parsing, the line
to change, and the findings of a comparison."""

from __future__ import annotations

import msgspec
import pytest

from ddpdoctor.analyses.tune import BASELINE, Trial, compare
from ddpdoctor.analyses.whatif import CapPrediction, WhatIf
from ddpdoctor.findings.tune import code_line, parse_try, plan, tune_findings
from ddpdoctor.rundir.schema import DDPModule


def _whatif(best: float | None = 1.0, measured_exposed_us: float = 6000.0) -> WhatIf:
    preds = [CapPrediction(1.0, 5, 2000.0, 9000.0, 100.0), CapPrediction(25.0, 1, 9000.0, 8000.0, 900.0),
             CapPrediction(100.0, 1, 9000.0, 8000.0, 900.0)]
    return WhatIf(True, step_time_us=20000.0, current_bucket_cap_mb=25.0, current_predicted_exposed_us=9000.0,
                  current_buckets_per_step=1, measured_exposed_us=measured_exposed_us, predictions=preds,
                  best_bucket_cap_mb=best)


CFG = DDPModule(bucket_cap_mb=25.0, find_unused_parameters=False, static_graph=False, gradient_as_bucket_view=False,
                parameter_bytes=4 << 20)


def _by_label(p):
    return {c.label: c for c in p.candidates}


def test_rules_choose_what_can_matter_and_say_why_the_rest_is_skipped():
    p = plan(CFG, _whatif(), set(), [12], [])
    c = _by_label(p)
    # The what-if's best cap changes the layout 1 -> 5 buckets; predicted (2000 - 9000) us = -7 ms.
    assert c["bucket_cap_mb=1"].chosen and c["bucket_cap_mb=1"].predicted_ms == pytest.approx(-7.0)
    assert c["static_graph=True"].chosen  # the same 12 parameters every step
    assert c["gradient_as_bucket_view=True"].chosen
    assert c["comm_hook=fp16"].chosen and "30.0%" in c["comm_hook=fp16"].why  # 6 of 20 ms exposed
    assert all(x.why for x in p.candidates)


def test_rules_skip_with_reasons():
    cfg = msgspec.structs.replace(CFG, gradient_as_bucket_view=True, static_graph=True)
    p = plan(cfg, _whatif(best=25.0, measured_exposed_us=100.0), set(), [12, 10], [])
    c = _by_label(p)
    assert not any(x.chosen for x in p.candidates)
    assert "no other cap" in c["bucket_cap_mb=25"].why
    assert "on already" in c["gradient_as_bucket_view=True"].why
    assert "0.5%" in c["comm_hook=fp16"].why
    p = plan(CFG, WhatIf(False, "no communication was recorded"), set(), [12, 10], [])
    c = _by_label(p)
    assert not c["bucket_cap_mb"].chosen and "no communication" in c["bucket_cap_mb"].why
    assert not c["static_graph=True"].chosen and "[12, 10]" in c["static_graph=True"].why


def test_find_unused_parameters_rules():
    cfg = msgspec.structs.replace(CFG, find_unused_parameters=True)
    c = _by_label(plan(cfg, _whatif(), {"find-unused-parameters-unneeded"}, [12], []))
    assert c["find_unused_parameters=False"].chosen
    c = _by_label(plan(cfg, _whatif(), {"static-graph-would-help"}, [10], []))
    assert c["static_graph=True"].chosen


def test_user_tries_come_first_and_max_variants_bounds_the_launches():
    tries = parse_try("bucket_cap_mb=50,100") + parse_try("gradient_as_bucket_view=True")
    p = plan(CFG, _whatif(), set(), [12], tries, max_variants=3)
    chosen = [c.label for c in p.chosen]
    assert chosen == ["bucket_cap_mb=50", "bucket_cap_mb=100", "gradient_as_bucket_view=True"]
    c = _by_label(p)
    assert c["bucket_cap_mb=100"].predicted_ms == pytest.approx(0.0)
    assert "over --max-variants 3" in c["bucket_cap_mb=1"].why
    a_a = plan(CFG, _whatif(), set(), [12], parse_try("bucket_cap_mb=25"), max_variants=1)
    assert "A/A" in a_a.chosen[0].why


@pytest.mark.parametrize("bad", ["bucket_cap_mb", "bucket_cap_mb=", "foo=1", "static_graph=yes", "bucket_cap_mb=x",
                                 "bucket_cap_mb=-1", "comm_hook=int8"])
def test_bad_try_is_refused_with_the_reason(bad):
    with pytest.raises(ValueError, match="--try"):
        parse_try(bad)


def test_the_line_to_change():
    assert code_line({"bucket_cap_mb": 100.0}) == "`DDP(model, bucket_cap_mb=100)`"
    assert code_line({"gradient_as_bucket_view": True}) == "`DDP(model, gradient_as_bucket_view=True)`"
    assert "fp16_compress_hook" in code_line({"comm_hook": "fp16"})


def _jit(c: float) -> tuple[float, ...]:
    return tuple(c + 0.1 * ((i % 5) - 2) for i in range(10))  # symmetric: the median is c


def test_findings_winner_with_measured_beside_predicted_and_gpu_hours():
    p = plan(CFG, _whatif(), set(), [12], [], max_variants=1)
    trials = [Trial(BASELINE, r, 10 * r, _jit(20.0), (1.0, 0.5)) for r in range(2)]
    trials += [Trial("bucket_cap_mb=1", r, 10 * r + 1, _jit(17.0), (1.0, 0.5)) for r in range(2)]
    found = {f.id: f for f in tune_findings(compare(trials), p.candidates, gpus_total=100)}
    w = found["tune-winner"]
    assert "measured -3.000 ± 0.000 ms, predicted -7.000 ms" in w.title
    assert w.advice == "Change the script: `DDP(model, bucket_cap_mb=1)`."
    # 3 of 20 ms on 100 GPUs all day: 100 * 24 * 0.15 = 360 GPU-hours.
    assert w.evidence["gpu_hours_per_day"] == pytest.approx(360.0)
    assert w.severity.value == "warning"  # 15% of the step, over the 5% line


def test_findings_no_winner_and_numerics():
    p = plan(CFG, _whatif(), set(), [12], parse_try("comm_hook=fp16"), max_variants=1)
    trials = [Trial(BASELINE, r, 10 * r, _jit(20.0), (1.0, 0.5)) for r in range(2)]
    trials += [Trial("comm_hook=fp16", r, 10 * r + 1, _jit(20.0), (1.0, 0.6)) for r in range(2)]
    found = {f.id: f for f in tune_findings(compare(trials), p.candidates)}
    assert "tune-winner" not in found and "tune-no-winner" in found
    assert found["tune-numerics-changed"].evidence["loss_rel_diff"] == pytest.approx(0.2)


def test_a_failed_trial_is_a_finding_error_for_the_baseline():
    p = plan(CFG, _whatif(), set(), [12], [], max_variants=1)
    trials = [Trial(BASELINE, 0, 0, _jit(20.0)), Trial("bucket_cap_mb=1", 0, 1, _jit(10.0), exit_code=1),
              Trial(BASELINE, 0, 2, _jit(20.0))]
    f = {x.id: x for x in tune_findings(compare(trials), p.candidates)}
    assert f["tune-trial-failed"].severity.value == "warning" and f["tune-trial-failed"].evidence["exit_codes"] == [1]
    trials[0] = Trial(BASELINE, 0, 0, (), exit_code=1)
    failed = [x for x in tune_findings(compare(trials), p.candidates) if x.id == "tune-trial-failed"]
    assert [x.severity.value for x in failed] == ["error", "warning"]  # the baseline's, then the variant's


def test_the_report_round_trips_typed_and_renders():
    import io
    import json
    from types import SimpleNamespace

    from rich.console import Console

    from ddpdoctor.renderers.html import render_html
    from ddpdoctor.renderers.views import view_for
    from ddpdoctor.reports.sections import TuneSection, load_report
    from ddpdoctor.reports.tune import ScriptHashes, TuneDesign, assemble

    p = plan(CFG, _whatif(), set(), [12], [], max_variants=1)
    trials = [Trial(BASELINE, 0, 0, _jit(20.0), (1.0,)), Trial("bucket_cap_mb=1", 0, 1, _jit(17.0), (1.0,)),
              Trial(BASELINE, 0, 2, _jit(20.0), (1.0,))]
    report = assemble(trials, p, SimpleNamespace(cfg=CFG, whatif=_whatif()),
                      design=TuneDesign(warmup=5, steps=10, rounds=1, profile_run="profile", trials_dir="trials"),
                      script=ScriptHashes(path="t.py", sha256_before="a", sha256_after="a"), tolerance=1e-4)
    doc = json.loads(json.dumps(report.to_json()))
    (row,) = doc["variants"]
    assert row["setting"] == "bucket_cap_mb=1" and row["diff_ms"] == -3.0 and row["predicted_ms"] == -7.0
    assert doc["tune"]["design"]["order"] == [BASELINE, "bucket_cap_mb=1", BASELINE]
    again = load_report(doc)
    assert again.section(TuneSection) is not None and again.to_json() == doc
    out = Console(file=io.StringIO(), width=200)
    view = view_for(again)
    assert view is not None
    view(again, out, False)
    text = out.file.getvalue()
    assert "measured -3.000 ± 0.000 ms" in text and "predicted -7.000 ms" in text
    assert 'id="tune"' in render_html(again)


def test_fsdp2_knobs_are_planned_parsed_and_checked_in_effect():
    # #37 item 5: FSDP2's variants, from rank 0's units (the root left out)
    from ddpdoctor.analyses.tune import fsdp_in_effect
    from ddpdoctor.findings.tune import fsdp_code_line, fsdp_plan, parse_try
    from ddpdoctor.rundir.schema import AppliedSetting, FSDPUnit

    units = [FSDPUnit(fqn=str(i), bytes=1024 * 1024, sharded_bytes=512 * 1024, reshard_after_forward=True)
             for i in (0, 2, 4)] + [FSDPUnit(fqn="", is_root=True)]
    chosen = {c.label: c.why for c in fsdp_plan(units, []).chosen}
    assert set(chosen) == {"forward_prefetch=1", "reshard_after_forward=False"}
    assert "none of the 3 units" in chosen["forward_prefetch=1"] and "1.5 MiB" in chosen["reshard_after_forward=False"]
    prefetching = [FSDPUnit(fqn="0", forward_prefetch=["2"]), FSDPUnit(fqn="2")]
    assert "forward_prefetch=2" not in {c.label for c in fsdp_plan(prefetching, []).chosen}
    assert parse_try("forward_prefetch=0,2") == [{"forward_prefetch": 0}, {"forward_prefetch": 2}]
    assert parse_try("reshard_after_forward=False") == [{"reshard_after_forward": False}]
    for bad in ("backward_prefetch=0", "forward_prefetch=x", "reshard_after_forward=maybe"):
        with pytest.raises(ValueError):
            parse_try(bad)
    assert "set_modules_to_forward_prefetch(units[i + 1:i + 1 + 2])" in fsdp_code_line({"forward_prefetch": 2})
    # in effect: what the ranks recorded after the probe set it
    done = [FSDPUnit(fqn="0", forward_prefetch=["2"]), FSDPUnit(fqn="2")]
    applied = [AppliedSetting(options={"forward_prefetch": 1})]
    assert fsdp_in_effect({"forward_prefetch": 1}, done, applied, []) == (True, "forward_prefetch=1 recorded, 2 unit(s)")
    ok, seen = fsdp_in_effect({"forward_prefetch": 1}, [FSDPUnit(fqn="0"), FSDPUnit(fqn="2")], applied, [])
    assert not ok and "(asked 1)" in seen
    assert fsdp_in_effect({"forward_prefetch": 1}, done, [], ["boom"])[0] is False

"""`ddpdoctor tune`'s pure analysis: the honesty rule for a winner, the loss comparison, the in-effect check and the
figures worked out by hand (docs/tune.md)."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses.tune import (
    BASELINE,
    Trial,
    compare,
    gpu_hours_per_day,
    in_effect,
    job_step_ms,
    numerics,
)
from ddpdoctor.rundir.schema import AppliedSetting, BucketLayout, DDPModule


def _trials(label: str, per_launch: list[list[float]], start_order: int = 0, losses=()) -> list[Trial]:
    """Launches in the order tune makes them: baseline launch i at order 2i, variant launch i at 2i + 1."""
    return [Trial(label, i, start_order + 2 * i, tuple(ms), tuple(losses)) for i, ms in enumerate(per_launch)]


def _jitter(center: float, n: int = 12, spread: float = 0.2) -> list[float]:
    # A fixed saw-tooth around the centre: deterministic, with a known range.
    return [center + spread * ((i % 5) - 2) / 2 for i in range(n)]


def test_a_clearly_faster_variant_is_the_winner_with_a_paired_difference_worked_by_hand():
    # A B A B A: baseline launches at 20.0, 20.2, 20.0 ms; each variant launch at 15.1 sits between two baseline
    # launches whose mean is 20.1, so every paired iteration differs by exactly -5.0 ms.
    base = _trials(BASELINE, [_jitter(20.0), _jitter(20.2), _jitter(20.0)])
    fast = _trials("bucket_cap_mb=1", [_jitter(15.1), _jitter(15.1)], start_order=1)
    r = compare(base + fast)
    v = r.variants[0]
    assert v.winner and v.verdict == "faster"
    assert v.diff is not None and v.diff.value == pytest.approx(-5.0) and v.diff.lo == pytest.approx(-5.0)
    assert v.step is not None and r.baseline.step is not None and v.step.hi < r.baseline.step.lo
    assert r.launch_spread_ms == pytest.approx(0.2)  # consecutive baseline launches differ by 0.2 ms at most


def test_no_winner_inside_the_noise_overlapping_intervals():
    base = _trials(BASELINE, [[10, 14, 12, 11, 13, 12], [12, 13, 11, 14, 10, 12]])
    same = _trials("static_graph=True", [[11, 13, 12, 10, 14, 12], [13, 12, 10, 12, 11, 14]], start_order=1)
    v = compare(base + same).variants[0]
    assert not v.winner and v.verdict == "no measurable difference" and "overlaps" in v.why


def test_a_gain_smaller_than_the_launch_noise_is_not_a_winner():
    # Within each launch the steps are steady (narrow intervals), but consecutive baseline launches differ by
    # 4 ms: a 1 ms gain is inside what relaunching alone does.
    base = _trials(BASELINE, [_jitter(20.0, spread=0.01), _jitter(24.0, spread=0.01), _jitter(20.0, spread=0.01)])
    var = _trials("gradient_as_bucket_view=True", [_jitter(21.0, spread=0.01), _jitter(21.0, spread=0.01)], 1)
    r = compare(base + var)
    v = r.variants[0]
    assert r.launch_spread_ms == pytest.approx(4.0)
    assert v.diff is not None and v.diff.value == pytest.approx(-1.0)
    assert not v.winner and v.verdict == "no measurable difference"


def test_faster_in_one_launch_only_is_not_a_winner():
    base = _trials(BASELINE, [_jitter(20.0), _jitter(20.0)])
    var = _trials("x", [_jitter(10.0), _jitter(25.0)], 1)
    v = compare(base + var).variants[0]
    assert not v.winner


def test_a_clearly_slower_variant_is_slower_not_a_winner():
    base = _trials(BASELINE, [_jitter(10.0), _jitter(10.1)])
    slow = _trials("comm_hook=fp16", [_jitter(14.0), _jitter(14.1)], 1)
    v = compare(base + slow).variants[0]
    assert v.verdict == "slower" and not v.winner


def test_a_setting_not_in_effect_or_a_failed_launch_is_never_a_winner():
    base = _trials(BASELINE, [_jitter(20.0), _jitter(20.1)])
    fast = [Trial("comm_hook=bf16", r, 1 + 10 * r, tuple(_jitter(10.0)), in_effect=False, effect="bf16 hook not "
                  "registered") for r in range(2)]
    v = compare(base + fast).variants[0]
    assert v.verdict == "not applied" and not v.winner
    failed = [Trial("x", r, 1 + 10 * r, tuple(_jitter(10.0)), exit_code=1) for r in range(2)]
    v = compare(base + failed).variants[0]
    assert v.verdict == "failed" and not v.winner


def test_too_few_iterations_are_not_measured():
    base = _trials(BASELINE, [[10.0, 11.0]])
    var = _trials("x", [[5.0, 5.0]], 1)
    v = compare(base + var).variants[0]
    assert v.verdict == "not measured" and not v.winner


def test_numerics_identical_within_changed_undecided_and_not_finite():
    b = [Trial(BASELINE, r, r, (1.0,) * 3, (2.0, 1.5, 1.0)) for r in range(2)]
    same = [Trial("a", 0, 5, (1.0,), (2.0, 1.5, 1.0))]
    assert numerics(same, b).state == "identical"
    tiny = [Trial("a", 0, 5, (1.0,), (2.0, 1.5, 1.00001))]
    n = numerics(tiny, b)
    assert n.state == "within tolerance" and n.rel_diff == pytest.approx(1e-5) and n.iterations == 3
    big = [Trial("a", 0, 5, (1.0,), (2.0, 1.5, 1.01))]
    n = numerics(big, b)
    assert n.state == "changed" and n.rel_diff == pytest.approx(0.01)
    unseeded = [Trial(BASELINE, 0, 0, (1.0,), (2.0, 1.5, 1.0)), Trial(BASELINE, 1, 1, (1.0,), (2.1, 1.4, 1.1))]
    assert numerics(big, unseeded).state == "undecided"
    nan = [Trial("a", 0, 5, (1.0,), (2.0, float("nan"), 1.0))]
    assert numerics(nan, b).state == "not finite"


def test_in_effect_from_the_recorded_layout_and_hook():
    modules = [DDPModule(bucket_cap_mb=1.0, gradient_as_bucket_view=True, buckets=[BucketLayout()] * 3)]
    ok, seen, buckets = in_effect({"bucket_cap_mb": 1.0}, modules, [], [])
    assert ok and buckets == 3 and "bucket_cap_mb=1.0 recorded" in seen
    ok, seen, _ = in_effect({"bucket_cap_mb": 50.0}, modules, [], [])
    assert not ok and "asked 50.0" in seen
    ok, _, _ = in_effect({"comm_hook": "bf16"}, modules, [AppliedSetting(comm_hook=None)], ["comm_hook=bf16: TypeError: ..."])
    assert not ok
    ok, _, _ = in_effect({"comm_hook": "fp16"}, modules, [AppliedSetting(comm_hook="fp16")], [])
    assert ok
    assert in_effect({"static_graph": True}, [], [], [])[0] is False


def test_gpu_hours_per_day_and_job_step_time_by_hand():
    # 512 GPUs, a step 5 ms shorter than 100 ms: 5% of every day's 512 * 24 GPU-hours.
    assert gpu_hours_per_day(-5.0, 100.0, 512) == pytest.approx(614.4)
    assert gpu_hours_per_day(2.0, 100.0, 8) == pytest.approx(-3.84)
    # Iterations 1 and 2 of two ranks, mean over ranks, ms; rank 1 recorded only 2 iterations.
    assert job_step_ms([[9.0, 0.010, 0.020], [9.0, 0.012]], 1, 3) == pytest.approx([11.0, 20.0])


def test_trial_order_is_counterbalanced():
    from ddpdoctor.commands.tune_trials import Experiment

    seq = Experiment.sequence(["a", "b"], 2)
    assert [label for _, label in seq] == [BASELINE, "a", BASELINE, "b", BASELINE, "b", BASELINE, "a", BASELINE]
    assert [r for r, _ in seq] == [0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_a_launch_disturbed_by_other_load_leaves_the_comparison_undecided():
    # What an A/A tune on the shared machine recorded: steady baseline launches (~1.6 ms, spread 0.1 of the median),
    # the "variant" launches hit by bursts of other load (3 to 23 ms). Without the guard this was "slower".
    calm = [1.6, 1.5, 1.7, 1.6, 1.5, 1.8, 1.6, 1.7]
    burst = [22.9, 5.4, 9.6, 12.6, 11.4, 4.5, 18.4, 5.6]
    trials = _trials(BASELINE, [calm, calm, calm]) + _trials("bucket_cap_mb=25", [burst, burst], start_order=1)
    v = compare(trials).variants[0]
    assert v.verdict == "undecided" and not v.winner and "launch(es) 2, 4 were disturbed" in v.why
    # The same slowdown with steady iterations (a setting that really costs 10 ms) is decided.
    slow = [x + 10.0 for x in calm]
    v = compare(_trials(BASELINE, [calm, calm, calm]) + _trials("x", [slow, slow], start_order=1)).variants[0]
    assert v.verdict == "slower"

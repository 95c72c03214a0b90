"""Bucket what-if: DDP's bucket assignment and the serial all_reduce queue, against numbers worked out by hand."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses.bucket_replay import (
    MIB,
    Grad,
    assign_buckets,
    bucket_limits,
    simulate_step,
)
from ddpdoctor.analyses.whatif import bucket_whatif
from tests.unit.analysis_builders import analysis, bucket, fit, grads, rank, step


def test_default_cap_has_a_1mib_first_bucket_explicit_cap_does_not():
    assert bucket_limits(None) == [MIB, 25 * MIB]
    assert bucket_limits(25) == [25 * MIB, 25 * MIB]
    assert bucket_limits(0.5) == [MIB // 2, MIB // 2]


def test_assignment_matches_what_torch_built():
    # Gradient sizes (ready order) of Linear(64,300), 4x Linear(300,300), Linear(300,10): torch 2.13 rebuilt
    # them, with the default cap, into buckets of 1095640 and 439200 bytes (params 11..4 and 3..0).
    sizes = [40, 12000, 1200, 360000, 1200, 360000, 1200, 360000, 1200, 360000, 1200, 76800]
    out = assign_buckets(sizes, bucket_limits(None))
    assert [sum(sizes[i] for i in b) for b in out] == [1095640, 439200]
    assert out == [list(range(8)), list(range(8, 12))]
    # bucket_cap_mb=2 (explicit): one bucket, as torch built it.
    assert assign_buckets(sizes, bucket_limits(2)) == [list(range(12))]


def test_a_gradient_larger_than_the_cap_is_its_own_bucket():
    assert assign_buckets([10, 500, 10, 10], [100]) == [[0, 1], [2, 3]]
    assert assign_buckets([500, 10], [100]) == [[0], [1]]


def test_serial_queue_by_hand():
    g = [Grad(10, 100), Grad(20, 100), Grad(30, 100), Grad(40, 100)]
    # 200-byte buckets, 5 us latency, 10 B/us: each takes 25 us. b0 ready 20 -> 20..45; b1 ready 40 -> 45..70.
    sim = simulate_step(g, [200], latency_us=5, bytes_per_us=10, backward_end_us=40)
    assert [(b.start_us, b.end_us) for b in sim.buckets] == [(20, 45), (45, 70)]
    assert sim.exposed_us == 30 and sim.comm_us == 50
    # One bucket: ready 40, 45 us -> exposed 45.
    assert simulate_step(g, [1000], 5, 10, 40).exposed_us == 45
    # 100-byte buckets (15 us each) queue behind each other: 10..25, 25..40, 40..55, 55..70.
    sim = simulate_step(g, [100], 5, 10, 40)
    assert [(b.start_us, b.end_us) for b in sim.buckets] == [(10, 25), (25, 40), (40, 55), (55, 70)]
    assert sim.exposed_us == 30
    # Communication that ends before backward does is not exposed.
    assert simulate_step([Grad(0, 100)], [100], 5, 10, 1000).exposed_us == 0


def _four_mib_run(**over):
    """One rank, one 1000-us step; backward 0..400; four 1 MiB gradients ready at 100, 200, 300, 400;
    all_reduce = 10 us + 100 us per MiB; the run used one 4 MiB bucket (cap 25)."""
    cfg = {"bucket_cap_mb": 25.0, "find_unused_parameters": False, "parameters": [{"bytes": MIB}] * 4,
           "grad_ready_order": [3, 2, 1, 0], "buckets": [{"index": 0, "bytes": 4 * MIB}], "parameter_tensors": 4}
    fields = dict(
        grad_ready=grads(0, 1, [(100, MIB), (200, MIB), (300, MIB), (400, MIB)]),
        bandwidth=fit(10, MIB / 100), ddp=[cfg],
    )
    fields.update(over)
    r = rank(0, [step(1, dur=1000, comm=410, exposed=400, bw=(0, 400))])
    return analysis([r], **fields)


def test_whatif_by_hand():
    w = bucket_whatif(_four_mib_run())
    assert w.available and w.grad_source == "trace" and w.bandwidth_source == "fit"
    pred = {p.bucket_cap_mb: p for p in w.predictions}
    # cap 1: four buckets 100..210, 210..320, 320..430, 430..540 -> 140 us after backward's end (400).
    assert pred[1].buckets_per_step == 4 and pred[1].exposed_comm_us == pytest.approx(140)
    assert pred[1].comm_us == pytest.approx(440)
    assert pred[1].first_start_after_backward_start_us == pytest.approx(100)
    # cap >= 5: one 4 MiB bucket at 400, 410 us long -> 410 exposed.
    for cap in (5, 10, 25, 50, 100, 200):
        assert pred[cap].buckets_per_step == 1 and pred[cap].exposed_comm_us == pytest.approx(410)
    assert w.current_bucket_cap_mb == 25 and w.current_predicted_exposed_us == pytest.approx(410)
    assert w.measured_exposed_us == 400
    assert w.best_bucket_cap_mb == 1 and w.saving_us_per_step == pytest.approx(270)
    assert w.saving_pct_of_step == pytest.approx(27.0)


def test_interpolated_gradients_when_the_trace_has_none():
    # Without grad_ready, the 4 MiB spread at a constant byte rate over backward 0..400 gives the same times.
    w = bucket_whatif(_four_mib_run(grad_ready=[]))
    assert w.grad_source == "interpolated"
    assert {p.bucket_cap_mb: p.exposed_comm_us for p in w.predictions}[1] == pytest.approx(140)
    assert w.best_bucket_cap_mb == 1


def test_missing_sizes_come_from_the_manifest():
    w = bucket_whatif(_four_mib_run(grad_ready=grads(0, 1, [(100, None), (200, None), (300, None), (400, None)])))
    assert w.grad_source == "trace" and w.best_bucket_cap_mb == 1


def test_bandwidth_from_buckets_without_a_fit():
    run = _four_mib_run(bandwidth=fit(None, None, 0), buckets=[bucket(0, 1, 0, 4 * MIB, 400, 800, True, 400)])
    w = bucket_whatif(run)
    # 4 MiB in 400 us -> 100 us per MiB, no latency: cap 1 ends at 100+4*100=500 -> 100 exposed; one bucket 400.
    assert w.bandwidth_source == "buckets" and w.latency_us == 0
    assert {p.bucket_cap_mb: p.exposed_comm_us for p in w.predictions}[1] == pytest.approx(100)
    assert w.current_predicted_exposed_us == pytest.approx(400)


def test_current_kept_when_it_ties_with_the_best():
    # Gradients all ready at the very end: every layout exposes the full all_reduce; no change is advised.
    run = _four_mib_run(grad_ready=grads(0, 1, [(400, MIB)] * 4))
    w = bucket_whatif(run)
    assert w.best_bucket_cap_mb == 25 and w.saving_us_per_step == 0


def test_not_available_without_communication():
    r = rank(0, [step(1, dur=1000)], world_size=1)
    w = bucket_whatif(analysis([r]))
    assert not w.available and "no communication" in (w.reason or "")
    assert w.to_json()["available"] is False


def test_fit_transfer_by_hand():
    from ddpdoctor.analyses.whatif import fit_transfer

    # dur = 10 + bytes / 2: exact line through (100, 60), (300, 160).
    assert fit_transfer([(100, 60.0), (300, 160.0)]) == pytest.approx((10.0, 2.0))
    # One size only: through the origin, 400 bytes in 200 us.
    assert fit_transfer([(200, 100.0), (200, 100.0)]) == pytest.approx((0.0, 2.0))
    # A negative intercept is not physical: through the origin (400 bytes / 170 us).
    assert fit_transfer([(100, 10.0), (300, 160.0)]) == pytest.approx((0.0, 400 / 170))
    assert fit_transfer([]) is None


def test_transfer_time_excludes_waiting_for_the_last_rank():
    from ddpdoctor.analyses.results import MatchedCollective

    def m(nbytes, starts, ends):
        return MatchedCollective("k", "all_reduce", None, None, nbytes, starts, ends,
                                 max(starts.values()) - min(starts.values()), max(starts, key=starts.get))

    # Rank 1 arrives 500 us late each time; the transfer itself (last arrival -> end) is 10 + 100/MiB.
    matched = [m(MIB, {0: 0.0, 1: 500.0}, {0: 610.0, 1: 610.0}),
               m(3 * MIB, {0: 1000.0, 1: 1500.0}, {0: 1810.0, 1: 1810.0})]
    w = bucket_whatif(_four_mib_run(matched=matched, bandwidth=fit(999, 1.0)))
    assert w.bandwidth_source == "matched"
    assert w.latency_us == pytest.approx(10) and w.bytes_per_us == pytest.approx(MIB / 100)
    assert {p.bucket_cap_mb: p.exposed_comm_us for p in w.predictions}[1] == pytest.approx(140)


def test_fit_error_is_reported():
    w = bucket_whatif(_four_mib_run())
    # predicted 410 for the run's own layout, measured 400, step 1000 -> 1% of a step.
    assert w.fit_error_pct_of_step == pytest.approx(1.0)


def test_gpu_gradient_times_are_mapped_onto_the_device_backward_span():
    from dataclasses import replace

    # The CPU ran backward over 0..100 and the GPU over 300..700: CPU times 25, 50, 75, 100 become 400..700.
    run = _four_mib_run(grad_ready=grads(0, 1, [(25, MIB), (50, MIB), (75, MIB), (100, MIB)]))
    st = run.ranks[0].per_step[0]
    run.ranks[0].per_step[0] = replace(st, backward_start_us=300, backward_end_us=700,
                                       cpu_backward_start_us=0, cpu_backward_end_us=100)
    w = bucket_whatif(run)
    # cap 1: 400..510, 510..620, 620..730, 730..840 -> 140 after the device backward end (700).
    assert {p.bucket_cap_mb: p.exposed_comm_us for p in w.predictions}[1] == pytest.approx(140)


def test_sizes_from_measured_buckets_when_the_trace_has_no_shapes():
    # No shapes, no manifest: the run's two measured buckets (2 MiB starting at 250, 2 MiB starting at 450) give
    # the gradients ready at 100, 200 -> bucket 0 (1 MiB each) and 300, 400 -> bucket 1 (1 MiB each).
    run = _four_mib_run(grad_ready=grads(0, 1, [(100, None), (200, None), (300, None), (400, None)]), ddp=[],
                        buckets=[bucket(0, 1, 0, 2 * MIB, 250, 460), bucket(0, 1, 1, 2 * MIB, 460, 670, True, 270)])
    w = bucket_whatif(run)
    assert w.grad_source == "trace+bucket_sizes"
    assert {p.bucket_cap_mb: p.exposed_comm_us for p in w.predictions}[1] == pytest.approx(140)
    # The current layout (2 x 2 MiB) replayed: 200..410, 410..620 -> 220 exposed.
    assert w.current_predicted_exposed_us == pytest.approx(220)


def test_sizes_from_buckets_give_up_when_a_bucket_gets_no_gradient():
    from ddpdoctor.analyses.whatif import _sizes_from_buckets

    b = [bucket(0, 1, 0, 100, 50, 60), bucket(0, 1, 1, 100, 60, 70)]
    assert _sizes_from_buckets([10, 20, 55], b) == [50, 50, 100]
    assert _sizes_from_buckets([10, 20], b) is None


def test_lanes_run_all_reduces_at_once_as_gloo_does():
    from ddpdoctor.analyses.bucket_replay import Grad, simulate_step

    # Two 1000-byte buckets (cap 1000 B), both ready at t=0, 100 B/us, no latency, backward ends at 0.
    grads = [Grad(0.0, 1000), Grad(0.0, 1000)]
    serial = simulate_step(grads, [1000], 0.0, 100.0, 0.0, lanes=1)
    assert [(b.start_us, b.end_us) for b in serial.buckets] == [(0.0, 10.0), (10.0, 20.0)]
    assert serial.exposed_us == 20.0
    two = simulate_step(grads, [1000], 0.0, 100.0, 0.0, lanes=2)
    assert [(b.start_us, b.end_us) for b in two.buckets] == [(0.0, 10.0), (0.0, 10.0)]
    assert two.exposed_us == 10.0 and two.comm_us == 20.0


def test_observed_lanes_is_the_peak_overlap_per_step():
    from ddpdoctor.analyses.bucket_replay import observed_lanes
    from ddpdoctor.analyses.results import Bucket

    def b(step, start, end):
        return Bucket(rank=0, step=step, index=0, bytes=1, start_us=start, end_us=end, dur_us=end - start,
                      is_last=False, after_backward_end_us=0.0)

    # step 3: [0,10] and [5,15] overlap -> 2; step 4: [0,10] then [10,20] touch only -> 1; step 5: 2 again
    buckets = [b(3, 0, 10), b(3, 5, 15), b(4, 0, 10), b(4, 10, 20), b(5, 0, 10), b(5, 1, 2)]
    assert observed_lanes(buckets) == 2
    assert observed_lanes([]) == 1


def test_step_batch_gives_simulate_steps_floats_to_the_bit() -> None:
    # StepBatch (analyze's what-if at 200,000 steps) simulates alike steps together with numpy: it must give what
    # simulate_step gives on each step, bit for bit: ties in ready times, lanes, empty steps, steps of other layouts,
    # and a backward end before the last gradient.
    import random

    from ddpdoctor.analyses.bucket_replay import Grad, StepBatch, simulate_step

    rng = random.Random(40)
    for _ in range(60):
        sizes = [rng.choice([0, 1, 7, 100, 4096, 1 << 20, 3 << 20]) for _ in range(rng.randint(1, 9))]
        steps = []
        for _ in range(rng.randint(1, 30)):
            own = sizes if rng.random() < 0.8 else [rng.choice([5, 1 << 20]) for _ in range(rng.randint(0, 4))]
            grads = [Grad(rng.choice([rng.uniform(0, 500), 100.0]), b) for b in own]
            end = rng.choice([None, rng.uniform(0, 600), 100.0])
            steps.append((grads, end))
        limits = rng.choice([[1 << 20, 25 << 20], [100, 100], [4096], [3 << 20, 1 << 20, 7]])
        latency, rate, lanes = rng.uniform(0, 50), rng.uniform(0.5, 2000), rng.randint(1, 3)
        got = StepBatch(steps).simulate(limits, latency, rate, lanes)
        for i, (grads, end) in enumerate(steps):
            want = simulate_step(grads, limits, latency, rate, end, lanes)
            assert got.buckets[i] == len(want.buckets)
            assert got.exposed_us[i] == want.exposed_us and got.comm_us[i] == want.comm_us
            assert got.first_start_us[i] == (want.buckets[0].start_us if want.buckets else None)

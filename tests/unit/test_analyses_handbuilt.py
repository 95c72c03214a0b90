"""Every metric of docs/metrics.md against numbers worked out by hand on the traces of tracebuild.py."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpdoctor.analyses.pipeline import AnalyzeOptions, analyze_paths
from ddpdoctor.traces import intervals as iv
from tests.unit.tracebuild import cpu_trace, gpu_trace, write

approx = pytest.approx


def test_interval_union_and_intersection():
    s, e = np.array([5.0, 0.0, 20.0, 8.0]), np.array([10.0, 6.0, 30.0, 9.0])
    assert iv.union_len(s, e) == 20.0  # [0,10) + [20,30)
    assert iv.intersect_len((s, e), (np.array([9.0]), np.array([25.0]))) == 6.0  # [9,10) + [20,25)
    assert iv.union_len(np.empty(0), np.empty(0)) == 0.0


_spans = st.lists(st.tuples(st.integers(-50, 400), st.integers(-20, 120), st.floats(0, 1)), max_size=20)


@given(_spans, _spans)
def test_pair_intervals_give_numpys_float(a, b):
    """The plain-Python union and intersection (a step's few collectives) are the numpy ones, to the last bit:
    ties, touching and reversed intervals, and more than 8 merged pieces (numpy's pairwise sum) included."""
    pa = [(s + f, s + f + d / 3) for s, d, f in a]
    pb = [(s + f, s + f + d / 7) for s, d, f in b]

    def arr(p):
        return np.array([x for x, _ in p], dtype=np.float64), np.array([y for _, y in p], dtype=np.float64)

    assert iv.union_len_pairs(pa) == iv.union_len(*arr(pa))
    assert iv.intersect_len_pairs(pa, pb) == iv.intersect_len(arr(pa), arr(pb))


def test_pair_intervals_by_hand():
    assert iv.union_len_pairs([(5.0, 10.0), (0.0, 6.0), (20.0, 30.0), (8.0, 9.0)]) == 20.0
    assert iv.intersect_len_pairs([(5.0, 10.0), (0.0, 6.0), (20.0, 30.0)], [(9.0, 25.0)]) == 6.0
    assert iv.union_len_pairs([]) == 0.0


def _one(tmp_path, doc, name="r.json", **opts):
    a = analyze_paths([write(tmp_path / name, doc)], AnalyzeOptions(**opts))
    return a, a.ranks[0]


def test_cpu_gloo_rank_metrics(tmp_path):
    a, r = _one(tmp_path, cpu_trace(0))
    assert (r.device, r.backend, r.steps, r.step_ids) == ("cpu", "gloo", 2, [1, 2])
    assert r.compute_us == approx(138)  # 65 + 73: DataLoader, c10d enqueue and the wait op are not compute
    assert r.comm_us == approx(64)  # 24 + 40
    assert r.overlap_us == approx(24)  # [56,60) + [150,170)
    assert r.overlap_pct == approx(37.5)
    assert r.exposed_comm_us == approx(40)
    assert r.exposed_comm_pct == approx(20.0)  # 40 of 200
    assert r.idle_us == approx(22)  # 15 + 7
    assert r.data_wait_us == approx(5)
    assert r.backward_us == approx(60)
    assert r.comm_in_backward_us == approx(24)
    assert r.step_time_us == {"median": 100.0, "p90": 100.0, "max": 100.0}
    s1, s2 = r.per_step
    assert (s1.compute_us, s1.comm_us, s1.overlap_us, s1.exposed_comm_us, s1.idle_us, s1.data_wait_us) == approx(
        (65, 24, 4, 20, 15, 5))
    assert s1.overlap_pct == approx(100 * 4 / 24)
    assert (s1.backward_start_us, s1.backward_end_us, s1.comm_in_backward_us) == approx((30, 60, 4))
    assert (s2.compute_us, s2.comm_us, s2.overlap_us, s2.idle_us) == approx((73, 40, 20, 7))


def test_cpu_collectives_buckets_grad_ready(tmp_path):
    a, _ = _one(tmp_path, cpu_trace(0))
    c1, c2 = a.calls
    assert (c1.op, c1.group, c1.bytes, c1.step, c1.dur_us) == ("all_reduce", "0", 400, 1, approx(24))
    assert c1.start_rel_backward_us == approx(26) and c2.start_rel_backward_us == approx(10)
    assert c1.algbw_gbps == approx(400 / 24 / 1e3) and c1.busbw_gbps == approx(400 / 24 / 1e3)  # 2(n-1)/n = 1
    assert [(b.step, b.index, b.bytes, b.is_last, b.after_backward_end_us) for b in a.buckets] == [
        (1, 0, 400, True, approx(20)), (2, 0, 400, True, approx(20))]
    assert [(g.step, g.t_us, g.bytes) for g in a.grad_ready] == [(1, 55, 40), (2, 165, 40)]
    sec = a.to_sections()["collectives"]
    assert sec["count"] == 2 and sec["by_op"]["all_reduce"] == {"count": 2, "bytes": 800, "time_us": approx(64)}
    # One message size: latency cannot be separated from bandwidth.
    assert a.bandwidth.latency_us is None and a.bandwidth.points == 2


def test_hta_window_drops_last_step(tmp_path):
    _, r = _one(tmp_path, cpu_trace(0), window="hta")
    assert (r.step_ids, r.compute_us, r.comm_us, r.overlap_us) == ([1], approx(65), approx(24), approx(4))


def test_gpu_metrics_both_windows(tmp_path):
    a, r = _one(tmp_path, gpu_trace(0), name="g.json.gz")
    assert r.device == "gpu"
    assert (r.compute_us, r.comm_us, r.overlap_us, r.memory_us) == approx((70, 90, 20, 5))
    assert r.overlap_pct == approx(100 * 20 / 90)
    s1, s2 = r.per_step  # kernels belong to the step that launched them
    assert (s1.compute_us, s1.comm_us, s1.overlap_us, s1.idle_us) == approx((30, 30, 10, 45))
    assert (s2.compute_us, s2.comm_us, s2.overlap_us, s2.idle_us) == approx((40, 60, 10, 10))
    ar = a.calls[0]
    assert (ar.op, ar.bytes, ar.group) == ("all_reduce", 4000, "0")
    assert ar.algbw_gbps == approx(4000 / 30 / 1e3) and ar.busbw_gbps == approx(4000 / 30 / 1e3 * 1.5)
    assert [c.op for c in a.calls] == ["all_reduce", "all_reduce", "all_gather"]
    _, h = _one(tmp_path, gpu_trace(0), name="h.json", window="hta")
    assert (h.compute_us, h.comm_us, h.overlap_us, h.overlap_pct) == approx((30, 30, 10, 100 / 3))


@pytest.mark.parametrize("prefix", ["ncclKernel_", "ncclDevKernel_", "ncclDevKernel_Generic_", "rcclKernel_"])
def test_comm_kernel_names(tmp_path, prefix):
    _, r = _one(tmp_path, gpu_trace(0, kernel_prefix=prefix))
    assert r.comm_us == approx(90)


def test_no_communication_is_null_not_nan(tmp_path):
    doc = cpu_trace(0)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("gloo:")]
    a, r = _one(tmp_path, doc)
    assert r.comm_us == 0 and r.overlap_pct is None and a.to_sections()["ranks"][0]["overlap_pct"] is None
    assert any("no communication" in n for n in a.notes)


def test_cross_rank_skew_wait_straggler(tmp_path):
    write(tmp_path / "a.json", cpu_trace(0))
    write(tmp_path / "b.json", cpu_trace(1, delay=(6, 8)))
    a = analyze_paths([tmp_path])
    assert [m.key for m in a.matched] == ["0:#0", "0:#1"]
    assert [(m.arrival_skew_us, m.last_rank) for m in a.matched] == [(6, 1), (8, 1)]
    st = a.stragglers
    assert st.caused_wait_us == {0: 0.0, 1: 14.0} and st.last_arrival_count == {0: 0, 1: 2}
    assert st.arrival_skew_median_us == 7 and st.ranks == [1]  # 14 us of waits >= 5% of 200 us of steps
    assert a.clock_offsets_us == {0: 0.0, 1: 0.0}  # one host: one clock


def test_clock_alignment_on_collective_ends(tmp_path):
    write(tmp_path / "a.json", cpu_trace(0, host="h0"))
    write(tmp_path / "b.json", cpu_trace(1, delay=(6, 8), offset=1000.0, host="h1"))
    a = analyze_paths([tmp_path])
    assert a.clock_offsets_us == {0: 0.0, 1: approx(1000.0)}
    assert [m.arrival_skew_us for m in a.matched] == approx([6, 8])
    assert a.stragglers.ranks == [1]


def test_rank_from_filename_and_order(tmp_path):
    write(tmp_path / "job_rank-3.json", cpu_trace(dist=False))
    write(tmp_path / "other.json", cpu_trace(dist=False))
    a = analyze_paths([tmp_path])
    got = {(i.rank, i.rank_source) for i in a.inputs}
    assert got == {(3, "filename"), (4, "order")}
    assert any("input order" in n for n in a.notes)

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=25)


def _cells(rows):
    return {t for s, d in rows for t in range(s, s + d)}


@given(a=spans, b=spans, lo=st.integers(0, 40), width=st.integers(0, 40))
def test_interval_functions_match_unit_cells(a, b, lo, width):
    def arr(rows):
        return (np.array([s for s, _ in rows], dtype=float), np.array([s + d for s, d in rows], dtype=float))

    A, B = arr(a), arr(b)
    assert iv.union_len(*A) == len(_cells(a))
    assert iv.intersect_len(A, B) == len(_cells(a) & _cells(b))
    window = set(range(lo, lo + width))
    assert iv.clipped_len(*iv.merge(*A), lo, lo + width) == len(_cells(a) & window)

"""FSDP2 on a CPU (gloo) trace: FSDP's own record_function ranges are not compute (docs/metrics.md, "FSDP2 on CPU"),
worked by hand on one step."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses.pipeline import analyze_paths
from tests.unit.tracebuild import GLOO, MAIN, meta, write, x

UA = "user_annotation"


def fsdp_cpu_trace() -> dict:
    """One step [0,100) of a rank with one FSDP2 unit "0": forward all-gather [5,23) on the gloo thread while the
    main thread waits inside FSDP::all_gather (0); addmm [30,50); backward: AddmmBackward0's node [55,95) runs
    FSDP's pre-backward hook [55,60) then mm [62,90); the reduce-scatter (gloo:all_reduce) [60,70)."""
    ev = [meta(MAIN, "thread 10 (python)"), meta(GLOO, "thread 20 (pt_gloo_runloop)"),
          x("ProfilerStep#1", 0, 100, cat=UA),
          x("FSDP::pre_forward (0)", 0, 30, cat=UA),
          x("FSDP::all_gather (0)", 1, 24, cat=UA),
          x("fsdp::all_gather_copy_in", 2, 2),
          x("c10d::_allgather_base_", 4, 1),
          x("gloo:all_gather", 5, 18, tid=GLOO, cat=UA),
          x("FSDP::all_gather_copy_out (0)", 25, 3, cat=UA),
          x("aten::copy_", 25, 3),
          x("aten::addmm", 30, 20),
          x("autograd::engine::evaluate_function: AddmmBackward0", 55, 40),
          x("FSDP::pre_backward (0)", 55, 5, cat=UA),
          x("aten::mm", 62, 28),
          x("gloo:all_reduce", 60, 10, tid=GLOO, cat=UA)]
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2,
                                "pg_config": [{"pg_name": "0", "pg_size": 2, "ranks": [0, 1]}]}}


def test_fsdp_ranges_and_the_nodes_that_wrap_them_are_not_compute(tmp_path):
    r = analyze_paths([write(tmp_path / "rank0.json", fsdp_cpu_trace())]).ranks[0]
    # compute: copy-in [2,4) 2 + copy-out [25,28) 3 + addmm [30,50) 20 + mm [62,90) 28 = 53 (not the FSDP ranges,
    # not AddmmBackward0's node [55,95), which holds FSDP's pre-backward hook and its wait)
    assert r.compute_us == pytest.approx(53.0)
    assert r.comm_us == pytest.approx(28.0)  # [5,23) 18 + [60,70) 10
    # overlap: only [62,70) of the reduce-scatter runs beside mm: 8 of 28 = 28.6 %; exposed 20 (the whole
    # forward all-gather: the main thread waited in work.wait()). Counting FSDP's ranges as compute said 100 %.
    assert r.overlap_us == pytest.approx(8.0) and r.overlap_pct == pytest.approx(100 * 8 / 28, abs=0.1)
    assert r.exposed_comm_us == pytest.approx(20.0)


def test_unit_collectives_worked_by_hand(tmp_path):
    # The same step, with unit "0"'s reduce-scatter issued at the end of backward inside
    # FSDP::post_backward_reduce (0) [95,99): enqueued at 95.5, run by gloo (as gloo:all_reduce) [96,98.5).
    doc = fsdp_cpu_trace()
    doc["traceEvents"] += [x("FSDP::post_backward_reduce (0)", 95, 4, cat=UA),
                           x("c10d::_reduce_scatter_base_", 95.5, 0.5),
                           x("gloo:all_reduce", 96, 2.5, tid=GLOO, cat=UA)]
    a = analyze_paths([write(tmp_path / "rank0.json", doc)])
    ag, rs = a.fsdp  # the all-reduce [60,70) runs outside every FSDP range: no unit's
    assert (ag.unit, ag.op, ag.phase, ag.prefetched, ag.synchronous, ag.first) == ("0", "all_gather", "forward",
                                                                                   False, True, True)
    assert (ag.start_us, ag.dur_us, ag.exposed_us) == (5.0, 18.0, 18.0)  # nothing computes during [5,23)
    assert (rs.unit, rs.op, rs.phase, rs.synchronous) == ("0", "reduce_scatter", "backward", True)
    assert (rs.dur_us, rs.exposed_us) == (2.5, 2.5)
    [row] = a.to_sections()["fsdp_units"]["units"]  # one step, one rank: ms per step
    assert row["all_gather_forward_ms"] == 0.018 and row["reduce_scatter_exposed_ms"] == 0.003
    assert row["first"] is True and row["forward_prefetched"] is False


def test_late_peer_per_unit_worked_by_hand():
    # docs/metrics.md "Late peer": unit "2"'s forward all-gather starts at 100 us on rank 0 (20 us, all exposed) and
    # at 112 us on rank 1 (8 us, all exposed): rank 0 waited 12 us for rank 1; one step, two ranks: 0.006 ms/step.
    from ddpdoctor.analyses.fsdp_units import late_peer, unit_table
    from ddpdoctor.rundir.summary_records import UnitCollective

    def row(rank: int, start: float, dur: float) -> UnitCollective:
        return UnitCollective(rank=rank, step=0, unit="2", op="all_gather", phase="forward", prefetched=False,
                              synchronous=True, first=False, start_us=start, dur_us=dur, exposed_us=dur)

    rows = [row(0, 100.0, 20.0), row(1, 112.0, 8.0)]
    assert late_peer(rows) == ({"2": 12.0}, {"2": {1: 12.0}})
    (unit,) = unit_table(rows, steps=1)
    assert unit["late_peer_exposed_ms"] == 0.006 and unit["late_rank"] == 1
    # the wait is cut at the rank's own end and at its exposed part
    rows[0].dur_us, rows[0].exposed_us = 30.0, 5.0
    assert late_peer(rows)[0] == {"2": 5.0}
    # one rank alone: no peer, no wait
    assert unit_table(rows[:1], steps=1)[0]["late_rank"] is None


def fsdp_gpu_trace() -> dict:
    """One step [0,100) of a GPU rank with three FSDP2 units "0", "1", "2", each all-gather issued on demand by its
    unit's own pre-forward (docs/metrics.md#fsdp2-prefetch-replay): on the GPU, all-gather 0 [10,20), gemm 0
    [20,25), all-gather 1 [25,33), gemm 1 [33,45), all-gather 2 [45,51), gemm 2 [51,60). The CPU ranges end long
    before their kernels (the thread runs ahead): nothing is waited out."""
    def launch(ts: float, corr: int) -> dict:
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": ts, "dur": 0.5,
                "args": {"correlation": corr}}

    def kern(name: str, ts: float, dur: float, corr: int, stream: int = 7, **a: object) -> dict:
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": stream, "device": 0, **a}}

    ev = [x("ProfilerStep#1", 0, 100, tid=2, cat=UA)]
    gpu = [(10, 10, 5), (25, 8, 12), (45, 6, 9)]  # per unit: all-gather start, all-gather, gemm after it
    for k, (ag_start, ag, gemm) in enumerate(gpu):
        t = 5.0 * k
        ev += [x(f"FSDP::pre_forward ({k})", t, 3, tid=2, cat=UA), x(f"FSDP::all_gather ({k})", t + 0.5, 1.5, tid=2,
                                                                      cat=UA),
               launch(t + 1, 10 + k), launch(t + 3.5, 20 + k),
               kern("ncclDevKernel_AllGather_RING_LL", ag_start, ag, 10 + k, stream=13, **{
                   "Collective name": "allgather", "In msg nelems": 100, "Out msg nelems": 200, "dtype": "Float",
                   "Group size": 2, "Process Group Name": "0"}),
               kern("void gemm_kernel<float>", ag_start + ag, gemm, 20 + k)]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "hand-built"}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2}, "traceEvents": ev}


def test_prefetch_replay_worked_by_hand(tmp_path):
    # docs/metrics.md#fsdp2-prefetch-replay. all-gathers a = 10, 8, 6 us; the compute after each up to the next
    # all-gather's end c = 5 (gemm 0 in [20,33)), 12 (gemm 1 in [33,51)); all on demand, all exposed.
    # As run: unit 1's all-gather issued when gemm 0 ends (25): [25,33), gemm 1 waits 8; unit 2's at 45: waits 6.
    # Prefetched one deep: unit 1's issued when gemm 0 starts (20): [20,28), gemm 1 starts at max(25, 28) = 28,
    # waits 3, ends 40; unit 2's issued at 28: [28,34), gemm 2 starts at max(40, 34) = 40, waits 0.
    # Saved: unit 1 8 - 3 = 5 us (= min(8, 5)), unit 2 6 - 0 = 6 us (= min(6, 12)); unit 0 (first) 0.
    a = analyze_paths([write(tmp_path / "rank0.json", fsdp_gpu_trace())])
    ags = [r for r in a.fsdp if r.op == "all_gather"]
    assert [(r.unit, r.dur_us, r.exposed_us, r.prefetched, r.synchronous) for r in ags] == [
        ("0", 10.0, 10.0, False, False), ("1", 8.0, 8.0, False, False), ("2", 6.0, 6.0, False, False)]
    assert [r.compute_after_us for r in ags] == [5.0, 12.0, None]
    inventory = a.to_sections()["fsdp_units"]
    assert inventory["prefetch_replay"] == {"predictable": True, "reason": None, "forward_saved_ms": 0.011,
                                            "backward_saved_ms": 0.0}
    assert [u["forward_prefetch_saved_ms"] for u in inventory["units"]] == [0.0, 0.005, 0.006]
    from ddpdoctor.findings.perf_fsdp import fsdp_findings

    (f,) = [f for f in fsdp_findings(a) if f.id == "fsdp-no-prefetch"]
    assert f.evidence["predicted_saved_ms_per_step"] == 0.011
    assert f.evidence["predicted_by_unit_ms"] == {"1": 0.005, "2": 0.006}
    assert "predicts one-deep forward prefetch saves 0.01 ms per step" in f.advice


def test_prefetch_replay_waits_and_what_the_run_already_prefetched():
    from ddpdoctor.analyses.fsdp_replay import PassSlot, waits

    slots = [PassSlot("0", 10, False, 5), PassSlot("1", 8, False, 12), PassSlot("2", 6, False, None)]
    assert waits(slots, False) == [10, 8, 6] and waits(slots, True) == [10, 3, 0]
    # unit 1 already prefetched in the run: its wait is 3 as run, nothing left to save on it
    slots[1].prefetched = True
    assert waits(slots, False)[1] == 3
    # an all-gather longer than the compute before it is hidden only in part: a = 10, 30, 6, c = 5, 1: unit 1's
    # [10,40) (issued when gemm 0 starts at 10), gemm 1 [40,41) waits 40 - 15 = 25; unit 2's issued at 40, [40,46),
    # gemm 2 waits 46 - 41 = 5
    long = [PassSlot("0", 10, False, 5), PassSlot("1", 30, False, 1), PassSlot("2", 6, False, None)]
    assert waits(long, True) == [10, 25, 5]


def test_no_prediction_where_the_main_thread_waits_out_every_all_gather(tmp_path):
    # the CPU (gloo) step above: FSDP2's async_op=False all-gather is waited out by the main thread
    a = analyze_paths([write(tmp_path / "rank0.json", fsdp_cpu_trace())])
    replay = a.to_sections()["fsdp_units"]["prefetch_replay"]
    assert replay["predictable"] is False and replay["forward_saved_ms"] is None
    assert "async_op=False" in replay["reason"] and "tune --try forward_prefetch=1" in replay["reason"]
    assert "forward_prefetch_saved_ms" not in a.to_sections()["fsdp_units"]["units"][0]


def test_prefetch_replay_saves_at_most_what_the_run_left_exposed():
    from ddpdoctor.analyses.fsdp_replay import replay_prefetch
    from ddpdoctor.rundir.summary_records import UnitCollective

    def ag(unit: str, start: float, dur: float, exposed: float, after: float | None) -> UnitCollective:
        return UnitCollective(rank=0, step=0, unit=unit, op="all_gather", phase="forward", prefetched=False,
                              synchronous=False, first=unit == "0", start_us=start, dur_us=dur, exposed_us=exposed,
                              compute_after_us=after)

    # the worked example, but the GPU already hid all of unit 1's all-gather but 2 us of it: 2 + 6 = 8 us saved
    rep = replay_prefetch([ag("0", 10, 10, 10, 5), ag("1", 25, 8, 2, 12), ag("2", 45, 6, 6, None)])
    assert rep.predictable and rep.saved_us == {("0", "forward"): 0.0, ("1", "forward"): 2.0, ("2", "forward"): 6.0}
    assert rep.to_json(steps=1, ranks=1)["forward_saved_ms"] == 0.008

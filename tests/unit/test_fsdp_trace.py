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

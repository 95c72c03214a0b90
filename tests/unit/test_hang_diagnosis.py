"""Culprit rules of ddpdoctor.findings.hang and the monitor's timeouts, on hand-made heartbeat states."""

from __future__ import annotations

from ddpdoctor.findings.crash import crash_findings, fatal_error, is_victim
from ddpdoctor.findings.hang import DDP_BUCKETS, diagnose_hang, hang_findings, position
from ddpdoctor.launch.monitor import HangMonitor, RankLink, auto_hang_timeout


def coll(op: str, seq: int, sizes: list[list[int]] | None = None, site: str = "t.py:1") -> dict:
    return {"op": op, "group": "default_pg", "seq": seq, "sizes": sizes or [[4]], "call_site": site}


def beat(step: int = 5, phase: str = "other", collective: dict | None = None, where: str = "t.py:9", **kw) -> dict:
    return {"step": step, "phase": phase, "collective": collective, "where": where, **kw}


def test_rank_outside_collectives_is_the_culprit() -> None:
    ps = {0: position(0, beat(collective=coll("all_reduce", 7, site="t.py:3")), None),
          1: position(1, beat(phase="data", where="t.py:20"), None)}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "outside-collective" and d.culprit_ranks == [1]
    assert d.collective == {"op": "all_reduce", "seq": 7, "group": "default_pg"}
    assert ps[1].call_site == "t.py:20" and ps[0].call_site == "t.py:3"


def test_lowest_sequence_number_never_launched_the_collective() -> None:
    ps = {0: position(0, beat(collective=coll("all_reduce", 8)), None),
          1: position(1, beat(collective=coll("all_reduce", 7)), None),
          2: position(2, beat(collective=coll("all_reduce", 8)), None)}
    d = diagnose_hang(ps, [0, 1, 2])
    assert d.kind == "seq-behind" and d.culprit_ranks == [1]
    assert d.collective["seq"] == 8


def test_ranks_in_different_collectives_are_a_mismatch() -> None:
    ps = {r: position(r, beat(collective=coll("all_reduce", 3, [[4]] if r != 2 else [[8]])), None) for r in range(3)}
    d = diagnose_hang(ps, [0, 1, 2])
    assert d.kind == "mismatch" and d.culprit_ranks == [2] and d.differs == ["sizes"]
    findings = hang_findings({"diagnosis": d.to_json(), "detected_after_s": 4.0, "hang_timeout_s": 3.0})
    assert [f.id for f in findings] == ["hang", "collective-mismatch"]
    assert findings[1].evidence["collectives"]["2"]["sizes"] == [[8]]


def test_rank_in_another_collective_than_ddp_buckets_left_the_loop() -> None:
    # Uneven batches: rank 0 reached the final barrier, rank 1 is still in DDP's gradient all-reduce.
    ps = {0: position(0, beat(collective=coll("barrier", 10, [])), None),
          1: position(1, beat(phase="backward", backward={"call_site": "t.py:13", "group": "default_pg", "seq": 10}),
                      None)}
    assert ps[1].op == DDP_BUCKETS and ps[1].call_site == "t.py:13"
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "mismatch" and d.culprit_ranks == [0]
    assert d.collective["op"] == DDP_BUCKETS


def test_rank_that_exited_while_others_wait_is_the_culprit() -> None:
    ps = {0: position(0, beat(), {"exit_code": 0, "steps_completed": 4}),
          1: position(1, beat(collective=coll("all_reduce", 9)), None)}
    d = diagnose_hang(ps, [1])
    assert d.kind == "rank-exited" and d.culprit_ranks == [0] and d.stalled_ranks == [1]


def test_nobody_distinguishable() -> None:
    ps = {r: position(r, beat(collective=coll("all_reduce", 4)), None) for r in range(2)}
    d = diagnose_hang(ps, [0, 1])
    assert d.kind == "unknown" and d.culprit_ranks == []


def test_victims_are_not_blamed() -> None:
    statuses = {
        0: {"exception": "RuntimeError: [pair.cc:537] Read error: Connection closed by peer", "ended_at": 10.0},
        1: {"exception": "ValueError: bad sample", "traceback": "Traceback...\nValueError: bad sample", "ended_at": 11.0},
    }
    (f,) = crash_findings(statuses)
    assert f.id == "rank-crashed" and f.evidence["rank"] == 1 and f.evidence["victims"] == [0]
    assert is_victim(statuses[0]["exception"]) and not is_victim(statuses[1]["exception"])


def test_died_rank_is_explained_from_its_stderr() -> None:
    stderr = (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4. Received data size "
        "doesn't match expected size.\nFatal Python error: Aborted\n\n"
        "Thread 0x0001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n\n'
        "Current thread 0x0002 (most recent call first):\n"
        '  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce\n'
        '  File "/job/train.py", line 17 in main\n'
        "\nExtension modules: numpy\n"
    )
    fatal = fatal_error(stderr)
    assert fatal is not None
    assert fatal["exception"].startswith("gloo::EnforceNotMet: [enforce fail")
    assert fatal["call_site"] == "/job/train.py:17" and fatal["op"] == "all_reduce"
    statuses = {0: None, 1: {"exception": "RuntimeError: Connection reset by peer", "ended_at": 3.0,
                             "failed_collective": coll("all_reduce", 9, [[8]], "/job/train.py:17")}}
    findings = crash_findings(statuses, stderr={0: stderr})
    ids = {f.id: f for f in findings}
    assert ids["rank-crashed"].evidence["rank"] == 0 and ids["rank-crashed"].evidence["victims"] == [1]
    mm = ids["collective-mismatch"].evidence
    assert mm["gloo_sizes"] == {"rank": 0, "received_bytes": 8, "expected_bytes": 4}
    assert mm["call_sites"] == {"0": "/job/train.py:17", "1": "/job/train.py:17"}


def test_a_victims_status_cut_short_takes_its_backward_site_from_its_last_heartbeat() -> None:
    # Seen in a loaded suite run: rank 1 was killed while its profiler exported, after the first write of its
    # status (no collective in it); its last heartbeat still showed it in backward() at train.py:13.
    stderr = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
              "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 676 vs 4. Received data "
              "size doesn't match expected size.\nFatal Python error: Aborted\n\n"
              "Current thread 0x0002 (most recent call first):\n"
              '  File "/job/train.py", line 16 in <module>\n')
    statuses = {0: None, 1: {"exception": "RuntimeError: Connection reset by peer", "ended_at": 3.0}}
    beats = {0: beat(3, "other", coll("all_reduce", 10, [[]], "/job/train.py:16")),
             1: beat(4, "backward", backward={"call_site": "/job/train.py:13", "since": 1.0, "group": "default_pg",
                                              "seq": 9})}
    (mm,) = [f for f in crash_findings(statuses, stderr={0: stderr}, last_beats=beats) if f.id == "collective-mismatch"]
    assert mm.evidence["call_sites"] == {"0": "/job/train.py:16", "1": "/job/train.py:13"}
    assert mm.evidence["collectives"]["1"]["op"] == DDP_BUCKETS


def test_unused_parameter_indices_are_named() -> None:
    exc = ("RuntimeError: Expected to have finished reduction in the prior iteration...\n"
           "Parameter indices which did not receive grad for rank {r}: 2 3\n")
    statuses = {r: {"exception": exc.format(r=r)} for r in (0, 1)}
    names = {r: ["body.weight", "body.bias", "aux.weight", "aux.bias", "out.weight"] for r in (0, 1)}
    unused = [f for f in crash_findings(statuses, param_names=names) if f.id == "unused-parameters"]
    assert len(unused) == 1 and unused[0].evidence == {"ranks": [0, 1], "parameters": ["aux.weight", "aux.bias"]}


def test_auto_hang_timeout() -> None:
    assert auto_hang_timeout(None) == 60.0
    assert auto_hang_timeout(2.0) == 60.0
    assert auto_hang_timeout(7.5) == 75.0


def test_stalled_ranks_use_startup_timeout_before_the_first_step() -> None:
    mon = HangMonitor(hang_timeout=3.0, startup_timeout=20.0)
    mon.world_size = 2
    mon.links = {0: RankLink(0, beat={"step": 0, "step_started": 100.0}),
                 1: RankLink(1, beat={"step": 4, "step_started": 100.0})}
    assert mon.stalled_ranks(now=104.0, job_started=95.0) == [1]  # 4 s > 3 s for a rank past step 0
    mon.links[1].beat = {"step": 4, "step_started": 102.0}
    assert mon.stalled_ranks(now=104.0, job_started=95.0) == []  # rank 0: 9 s < 20 s start-up
    assert mon.stalled_ranks(now=116.0, job_started=95.0) == [0, 1]


def test_ranks_that_never_reported_are_stalled_after_startup() -> None:
    mon = HangMonitor(hang_timeout=None, startup_timeout=10.0)
    mon.world_size = 3
    mon.links = {0: RankLink(0, beat={"step": 0}), 1: RankLink(1, beat={"step": 0})}
    assert mon.stalled_ranks(now=105.0, job_started=100.0) == []
    assert mon.stalled_ranks(now=111.0, job_started=100.0) == [2]
    assert mon.effective_hang_timeout() == 60.0


def test_a_rank_back_from_a_long_checkpoint_entering_backward_is_moving_not_hung() -> None:
    import json
    import time
    from types import SimpleNamespace

    from ddpdoctor.launch.monitor import STUCK_S
    from ddpdoctor.probes.heartbeat_lines import backward_line

    now = time.time()
    started = now - 70.0  # step 4 ended 70 s ago; rank 0 then wrote a checkpoint for 70 s
    mon = HangMonitor(hang_timeout=None, startup_timeout=20.0)
    mon.world_size = 2
    mon.links = {0: RankLink(0, beat=beat(4, "checkpoint", where="train.py:40", step_started=started)),
                 1: RankLink(1, beat=beat(4, "backward", step_started=started,
                                          backward={"call_site": "train.py:31", "since": started, "seq": 9}))}
    tracker = SimpleNamespace(step=4, step_started=started)
    mon._on_message(0, json.loads(backward_line("train.py:31", now, tracker)))
    b0 = mon.links[0].beat
    assert b0["step"] == 4 and b0["step_started"] == started and b0["where"] == "train.py:40"
    assert position(0, b0, None).op == DDP_BUCKETS and position(0, b0, None).call_site == "train.py:31"
    assert mon.effective_hang_timeout() == 60.0
    assert mon.stalled_ranks(now + 0.05, job_started=now - 99) == [0, 1]  # 70 s > 60 s: both look stalled ...
    assert mon._just_moved([0, 1], now + 0.05)  # ... but rank 0 has just moved: not a hang yet
    assert not mon._just_moved([0, 1], mon.links[0].moved_at + STUCK_S + 0.01)  # still there after 15 s: stuck
    mon.hang_timeout = 5.0  # an explicit --hang-timeout is a plain deadline
    assert not mon._just_moved([0, 1], now + 0.05)
    mon.hang_timeout = None
    moved = mon.links[0].moved_at
    mon._on_message(0, dict(b0, type="beat"))  # the next beat, same place: no move
    assert mon.links[0].moved_at == moved


def _unit_coll(op: str, seq: int, sizes: list[list[int]], unit: str, site: str) -> dict:
    return {**coll(op, seq, sizes, site), "unit": unit}


RS0 = "FSDP unit '0' (Linear), reduce-scatter on mesh dim 'dp'"
AG0 = "FSDP unit '0' (Linear), forward all-gather on mesh dim 'dp'"


def test_fsdp2_ranks_that_parted_at_a_unit_name_the_rank_that_went_on_and_the_unit() -> None:
    # The positions of tests/e2e/test_fsdp.py's freeze-unit launch (rank 1 froze unit '0' at step 2, so FSDP2
    # skipped its reduce-scatter there): gloo runs the reduce-scatter as an all_reduce. One rank on each side, so no
    # majority: rank 1 is at step 3's forward, past the collective rank 0 waits in: it skipped it.
    ps = {0: position(0, beat(2, "backward", _unit_coll("all_reduce", 36, [[65792]], RS0, "t.py:111")), None),
          1: position(1, beat(3, "forward", _unit_coll("all_gather", 36, [[32896]], AG0, "t.py:61")), None)}
    d = diagnose_hang(ps, [0])
    assert d.kind == "mismatch" and d.culprit_ranks == [1]
    assert d.collective == {"op": "all_reduce", "seq": 36, "group": "default_pg", "unit": RS0}
    assert d.reason.startswith(f"the ranks parted at {RS0} (step 2, backward; all_reduce #36 on default_pg): "
                               "rank(s) [0] wait in it while rank(s) [1] went on to " + AG0 + " (step 3, forward")
    out = hang_findings({"diagnosis": d.to_json(), "stacks": {}})
    assert out[0].ranks == [1] and "fully_shard units" in out[0].advice
    mismatch = out[1]
    assert mismatch.id == "collective-mismatch" and mismatch.evidence["collectives"]["0"]["unit"] == RS0
    assert f"in {AG0}" in mismatch.title
    # the same units, both in step 2's forward: which one skipped cannot be told, both are named with their units
    same = {0: position(0, beat(2, "forward", _unit_coll("all_gather", 9, [[32896]], AG0, "t.py:59")), None),
            1: position(1, beat(2, "forward", _unit_coll("all_gather", 9, [[514]], AG0.replace("'0'", "'6'"),
                                                         "t.py:59")), None)}
    d = diagnose_hang(same, [0, 1])
    assert d.culprit_ranks == [0, 1] and d.reason.startswith("the ranks parted between FSDP2 units")
    # a majority still decides: three ranks wait in the reduce-scatter, the one that went on is the culprit
    four = {r: position(r, beat(2, "backward", _unit_coll("all_reduce", 36, [[65792]], RS0, "t.py:111")), None)
            for r in (0, 2, 3)}
    four[1] = position(1, beat(3, "forward", _unit_coll("all_gather", 36, [[32896]], AG0, "t.py:61")), None)
    assert diagnose_hang(four, [0, 2, 3]).culprit_ranks == [1]

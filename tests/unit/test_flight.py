"""The collective ledger's NCCL source (issue 28): torch's Flight Recorder read into ledger rows and per-step device
time in collectives (analyses/flight.py), held step records published in order (probes/flight.py), and the
caused-wait rule on them.

What is real here: torch 2.13's own gloo Flight Recorder, dumped in this process; one NCCL entry recorded on GPUs
(tests/fixtures/flight, source inside). What is built: NCCL dumps with CUDA-event durations, in the exact layout of
torch 2.13's ``dump_json`` (FlightRecorderDetail.hpp) -- no GPU is available to record them -- for the worked
example of docs/metrics.md#ledger-sources, checked by hand."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.analyses.flight import decode, decode_timing, device_time
from ddpdoctor.analyses.ledger import GAP, HOST_BLOCKED, caused_wait, common_window
from ddpdoctor.probes.flight import BUDGET, MAX_BATCH_STEPS, MAX_POLL_S, MIN_POLL_S, NEW_SHARE, FlightSource

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight"
MS = 1e-3
T0 = 1_795_000_000_000_000_000  # a wall-clock start, ns


def test_a_real_gloo_dump_of_torch_2_13_decodes_into_ledger_rows_without_device_times() -> None:
    import torch
    import torch.distributed as dist

    from ddpdoctor.probes.flight import dump_json

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t0 = time.time_ns()
        a = torch.ones(3, 4)
        for _ in range(3):
            dist.all_reduce(a)
        dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0)
        t1 = time.time_ns()
        deadline = time.monotonic() + 30
        while True:  # gloo retires an entry on its worker thread, just after the caller's wait returned
            raw = dump_json()
            rows = [c for c in decode(raw) if t0 <= c.enqueued_ns <= t1]  # the ring is process-wide
            if all(c.retired for c in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    finally:
        dist.destroy_process_group()
    assert [c.op for c in rows] == ["gloo:all_reduce"] * 3 + ["gloo:broadcast"]
    assert [c.nbytes for c in rows] == [48, 48, 48, 16]
    assert [c.seq for c in rows] == list(range(rows[0].seq, rows[0].seq + 4)) and rows[0].desc == "default_pg"
    # gloo keeps no events: never "completed", no duration; retired once done
    assert all(c.state == "scheduled" and c.retired and c.duration_s is None and not c.p2p for c in rows)
    (st,) = device_time(decode_timing(raw), [(1, t0, t1 + 1)])
    assert st.seconds is None and not st.pending and st.missing and "carry no duration" in st.missing
    assert st.collectives == 4


def test_a_real_nccl_entry_recorded_on_gpus_decodes_and_is_untimed() -> None:
    raw = (FIXTURES / "nccl_entry_tutorial.json").read_bytes()
    (c,) = decode(raw)
    assert (c.op, c.group, c.desc, c.seq, c.nbytes) == ("nccl:all_reduce", "0", "default_pg", 1, 48)
    assert c.enqueued_ns == 1724779239936775119 and c.noticed_done_ns == 1724779239975811724
    assert c.state == "completed" and c.retired and c.duration_s is None  # that run had timing off
    (st,) = device_time(decode_timing(raw), [(7, c.enqueued_ns - 1, c.enqueued_ns + 1)])
    assert st.seconds is None and st.missing and "TORCH_NCCL_ENABLE_TIMING" in st.missing
    assert c.to_json()["completed_ns"] == 1724779239975811724


def test_a_dump_that_is_not_one_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="Flight Recorder"):
        decode(b'{"entries": [{"record_id": "x"}]}')


# -- NCCL dumps in torch 2.13's JSON layout ------------------------------------------------------------------------
def _entry(rid: int, seq: int, op: str, created_ns: int, sizes: list[list[int]], dtype: str,
           duration_ms: float | None, done: bool = True) -> dict[str, Any]:
    e: dict[str, Any] = {
        "record_id": rid, "pg_id": 0, "process_group": ["0", "default_pg"], "thread_name": "pt_main_thread",
        "thread_id": "140000000000000", "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq,
        "profiling_name": op, "time_created_ns": created_ns, "input_sizes": sizes, "input_dtypes": [dtype] * len(sizes),
        "output_sizes": sizes, "output_dtypes": [dtype] * len(sizes),
        "state": "completed" if done else "started",
        "time_discovered_started_ns": created_ns + 1_000_000,
        "time_discovered_completed_ns": created_ns + 100_000_000 if done else 0,
        "retired": done, "timeout_ms": 600000, "is_p2p": False,
    }
    if duration_ms is not None:
        e["duration_ms"] = duration_ms
    return e


def _dump(entries: list[dict[str, Any]]) -> bytes:
    return json.dumps({"version": "2.10", "comm_lib_version": "2.27.5", "pg_config": {}, "pg_status": {},
                       "entries": entries, "nccl_comm_state": {}}).encode()


# The worked example (docs/metrics.md#ledger-sources): 4 ranks, 100 ms steps; per step one group runs bucket A (25 MiB),
# bucket B (4 MiB) and an 8-byte flag broadcast. Rank 3's GPU reaches bucket A 30 ms after the others'.
A_MS = {0: 35.0, 1: 35.0, 2: 35.0, 3: 5.0}
B_MS, FLAG_MS = 4.0, 0.1
HOST_MS = {"data": 10.0, "forward": 20.0, "backward": 40.0, "optimizer": 29.8, "collective": 0.2}  # every rank
STEPS = 20


def _window(step: int) -> tuple[int, int]:
    return T0 + (step - 1) * 100_000_000, T0 + step * 100_000_000


def _rank_entries(rank: int, steps: Iterable[int], done_until: int | None = None) -> list[dict[str, Any]]:
    out = []
    for k in steps:
        start, _ = _window(k)
        for j, (op, at_ms, sizes, dtype, dur) in enumerate((
                ("nccl:broadcast", 5, [[1]], "Long", FLAG_MS),
                ("nccl:all_reduce", 60, [[6553600]], "Float", A_MS[rank]),
                ("nccl:all_reduce", 70, [[1048576]], "Float", B_MS))):
            seq = 3 * (k - 1) + j + 1
            done = done_until is None or seq <= done_until
            out.append(_entry(seq - 1, seq, op, start + at_ms * 1_000_000, sizes, dtype, dur if done else None, done))
    return out


def _held(source: FlightSource, steps: range) -> None:
    for k in steps:
        start, end = _window(k)
        source.hold((k, 0.1, {p: v * MS for p, v in HOST_MS.items()}), start / 1e9, end / 1e9)


def test_worked_example_device_time_names_the_rank_whose_gpu_is_late_where_the_host_sees_nothing() -> None:
    device: dict[int, list[Any]] = {}
    for r in range(4):
        out: list[Any] = []
        src = FlightSource(out.append, dump=lambda r=r: _dump(_rank_entries(r, range(1, STEPS + 1))), ring=2000)
        _held(src, range(1, STEPS + 1))
        assert src.poll() == STEPS and not src.held
        device[r] = out
    step, secs, ph = device[0][9]
    assert step == 10 and secs == 0.1
    assert ph["collective"] == pytest.approx((35.0 + 4.0 + 0.1) * MS)  # rank 0's stream: 39.1 ms in collectives
    assert ph[HOST_BLOCKED] == pytest.approx(0.2 * MS) and ph["backward"] == pytest.approx(40 * MS)
    assert device[3][9][2]["collective"] == pytest.approx(9.1 * MS)
    verdict = caused_wait(device)
    (w,) = verdict.waited_for
    # by hand: the others' median 39.1 ms - rank 3's 9.1 ms = 30.0 ms per step, 30% of the 100 ms step; no host
    # phase of rank 3 is longer, so no phase is named (its GPU is the slow part)
    assert w.rank == 3 and w.cost_s == pytest.approx(30.0 * MS) and w.pct_of_step == pytest.approx(30.0)
    assert w.phase is None and w.steps == (6, 20)
    assert verdict.split_s[0] == pytest.approx((39.1 * MS, 30.0 * MS, 9.1 * MS))  # blocked = waiting + transfer
    # The same job as the host sees it (NCCL does not block the thread: 0.2 ms everywhere): nobody is named.
    host = {r: [(k, 0.1, {p: v * MS for p, v in HOST_MS.items()}) for k in range(1, STEPS + 1)] for r in range(4)}
    assert caused_wait(host).waited_for == []


def test_a_step_waits_for_its_last_collective_and_steps_go_out_in_order() -> None:
    out: list[Any] = []
    state = {"done_until": 8}  # steps 1-2 (seq 1-6) done, step 3's bucket B (seq 9) still running
    src = FlightSource(out.append, dump=lambda: _dump(_rank_entries(0, range(1, 6), state["done_until"])), ring=2000)
    _held(src, range(1, 6))
    assert src.poll() == 2 and [r[0] for r in out] == [1, 2] and len(src.held) == 3
    state["done_until"] = 15
    assert src.poll() == 3 and [r[0] for r in out] == [1, 2, 3, 4, 5]
    assert all(GAP not in r[2] for r in out) and src.summary()["steps_with_device_time"] == 5


def test_steps_whose_collectives_left_the_ring_or_never_finished_are_gaps_the_rule_leaves_out() -> None:
    out: list[Any] = []
    entries = _rank_entries(0, range(1, 6))
    src = FlightSource(out.append, dump=lambda: _dump(entries[4:]), ring=11)  # ids 0-3 overwritten: step 1, 2
    _held(src, range(1, 6))
    src.poll()
    assert [GAP in r[2] for r in out] == [True, True, False, False, False]
    assert "left the Flight Recorder's ring" in (src.summary()["why_without"] or "")
    # a step still running when the job ends goes out as a gap, with the reason
    out.clear()
    late = FlightSource(out.append, dump=lambda: _dump(_rank_entries(0, range(1, 3), done_until=4)), ring=2000)
    _held(late, range(1, 3))
    late.close()
    assert [GAP in r[2] for r in out] == [False, True] and "job ended" in (late.last_gap or "")
    # the rule: a step one rank could not time is out of every rank's window
    recs = {r: [(k, 0.1, {"collective": 0.01, "forward": 0.05} | ({GAP: 0.0} if (r, k) == (1, 12) else {}))
                for k in range(1, 31)] for r in range(3)}
    window = common_window(recs)
    assert 12 not in window and len(window) == 24


def test_the_ring_is_read_before_it_turns_over_and_as_rarely_as_its_cost_asks() -> None:
    now = {"t": 0.0, "n": 200}
    entries = _rank_entries(0, range(1, 401))  # 1,200 entries
    src = FlightSource(lambda rec: None, dump=lambda: _dump(entries[:now["n"]]), ring=2000, clock=lambda: now["t"])
    now.update(t=1.0)
    _held(src, range(1, 2))
    src.poll()
    now.update(t=2.0, n=1200)  # 1,000 new entries in a second
    _held(src, range(2, 3))
    before = src.poll_s
    src.poll()
    cost = src.poll_s - before
    assert src.rate == pytest.approx(1000.0)
    # lossless: 3/4 of the ring's 2,000 entries at 1,000 per second = 1.5 s; the cost bound: cost / BUDGET
    assert NEW_SHARE == 0.75 and src.interval == pytest.approx(max(MIN_POLL_S, min(cost / BUDGET, 1.5)))
    now.update(t=12.0)  # nothing new for 10 s, and a read of 40 ms: 20 s by the budget, capped at MAX_POLL_S
    src._adapt(decode_timing(_dump(entries)), cost_s=0.04)
    assert src.rate == 0.0
    assert src.interval == MAX_POLL_S
    now.update(t=13.0)  # 300 steps in a second: read before MAX_BATCH_STEPS (200) wait, 0.67 s
    _held(src, range(4, 304))
    src._adapt(decode_timing(_dump(entries)), cost_s=0.04)
    assert src.step_rate == pytest.approx(300.0) and src.interval == pytest.approx(MAX_BATCH_STEPS / 300)


def test_nccl_collectives_are_read_from_nccls_own_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch keeps two recorders; NCCL's collectives go only to ProcessGroupNCCL's (`_dump_nccl_trace_json`, absent
    # from this CPU build: stood in for here), gloo's to the generic one.
    import torch

    from ddpdoctor.probes.flight import dump_json

    c10d = torch._C._distributed_c10d
    generic = dump_json("gloo")
    decode_timing(generic)  # the real generic recorder answers on this build, in the layout decoded here
    if not hasattr(c10d, "_dump_nccl_trace_json"):
        assert dump_json("nccl") == generic  # a CPU build: the generic one, rather than nothing
        monkeypatch.setattr(c10d, "_dump_nccl_trace_json", lambda: b'{"entries": [], "nccl": 1}', raising=False)
    assert dump_json("nccl") != generic and dump_json("cuda:nccl,cpu:gloo") == dump_json("nccl")
    assert dump_json("gloo") == generic


def test_live_watch_on_flight_recorder_records_names_the_gpu_late_rank_with_no_phase(tmp_path: Path) -> None:
    # The worked example's records as the NCCL source publishes them (device "collective", the host's own under
    # "host_collective", a few gap steps) through the live watch: alert, status and the run's final finding.
    from ddpdoctor.live.findings import live_findings
    from ddpdoctor.live.health import LiveHealth
    from ddpdoctor.live.status import load_status, status_text
    from ddpdoctor.rundir.layout import RunDir

    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    health = LiveHealth(tmp_path, world_size=4)
    health.local_ranks = 4
    for s in range(1, 41):
        for r in range(4):
            ph = {p: v * MS for p, v in HOST_MS.items() if p != "collective"}
            ph[HOST_BLOCKED] = 0.2 * MS
            if s % 7 == 0 and r == 1:
                ph[GAP] = 0.0  # rank 1 could not time this step: out of every rank's window
            else:
                ph["collective"] = (9.1 if r == 3 else 39.1) * MS
            health.ingest(r, [[s, 0.1, ph]], "forward")
    (alert,) = health.tick(now=1000.0)
    ev = alert["evidence"]
    assert alert["ranks"] == [3] and ev["measured_by"] == "ledger" and ev["phase"] is None
    assert ev["caused_wait_ms_per_step"] == pytest.approx(30.0) and ev["cost_pct_of_step"] == pytest.approx(30.0)
    # 30 steps judged over 6-40: the 35 past warm-up less the 5 that rank 1 could not time
    assert list(ev["steps"]) == [6, 40]
    assert "none of its host phases is longer" in alert["title"]
    assert "waited for: rank 3 in no longer host phase (device work?), 30.0 ms per step" in status_text(
        load_status(tmp_path, now=1000.0))
    health.finish()
    (f,) = live_findings(RunDir(tmp_path))
    assert f.id == "slow-rank" and "its GPU work is slower" in f.advice


def test_a_failed_read_keeps_steps_held_and_a_step_without_collectives_needs_a_later_entry() -> None:
    out: list[Any] = []
    state: dict[str, Any] = {"fail": True, "steps": [1, 2]}

    def dump() -> bytes:
        if state["fail"]:
            raise RuntimeError("the NCCL process group was destroyed before its last collectives were read")
        return _dump(_rank_entries(0, state["steps"]))

    src = FlightSource(out.append, dump=dump, ring=2000)
    _held(src, range(1, 4))  # step 3 issues no collective (a gradient-accumulation step under no_sync)
    assert src.poll() == 0 and len(src.held) == 3 and "destroyed" in (src.error or "")
    state["fail"] = False
    assert src.poll() == 2 and len(src.held) == 1  # step 3: nothing recorded after it yet, so not known to be 0
    state["steps"] = [1, 2, 4]  # step 4's collectives are recorded: step 3 had none
    assert src.poll() == 1 and out[-1][0] == 3 and out[-1][2]["collective"] == 0.0
    state["fail"] = True
    _held(src, range(4, 5))
    src.close()  # the last read fails: what is held goes out as a gap that says why
    assert out[-1][0] == 4 and GAP in out[-1][2] and any("destroyed" in why for why in src.gap_reasons)


def test_a_steps_device_time_is_linear_in_entries_and_steps() -> None:
    # Lines of ddpdoctor executed (deterministic, not wall time) for 8x the steps and entries: about 8x; a scan of
    # every entry per step would be ~64x.
    from tests.unit.test_analyze_scaling import MAX_GROWTH, lines_executed

    def cost(steps: int) -> int:
        raw = _dump(_rank_entries(3, range(1, steps + 1)))
        windows = [(k, *_window(k)) for k in range(1, steps + 1)]
        n, times = lines_executed(lambda: device_time(decode_timing(raw), windows))
        assert [t.seconds for t in times] == pytest.approx([9.1 * MS] * steps)
        return n

    assert cost(800) / cost(100) < MAX_GROWTH


@pytest.mark.parametrize(("source", "user", "expected"), [
    ("flight-recorder", None, "1"), ("flight-recorder", "0", "0"), ("host", None, None),
    ("auto", None, None),  # opt-in until the source has run on a GPU (probes/ledger.AUTO_USES_FLIGHT_RECORDER)
])
def test_the_probe_turns_nccl_timing_on_only_when_asked_and_never_over_the_users_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, user: str | None, expected: str | None) -> None:
    import os

    from ddpdoctor.probes.ledger import LedgerProbe
    from ddpdoctor.probes.steps import StepTracker

    monkeypatch.setenv("DDPDOCTOR_LEDGER_SOURCE", source)
    if user is None:
        monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    else:
        monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", user)
    probe = LedgerProbe(StepTracker(), 0, tmp_path / "ledger.json")
    probe.install()
    try:
        assert os.environ.get("TORCH_NCCL_ENABLE_TIMING") == expected
    finally:
        probe.uninstall()

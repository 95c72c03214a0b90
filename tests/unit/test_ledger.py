"""The collective ledger (issue 28): the caused-wait rule on hand-worked and synthetic 4,096-rank summaries, and the
in-rank probe on a real (one-rank, gloo) DDP backward."""

from __future__ import annotations

import random
import time

import pytest

from ddpdoctor.analyses.ledger import CPU_TIME, CPU_WAIT, SCHED_SLICE_S, caused_wait

Records = dict[int, list[tuple[int, float, dict[str, float]]]]


def _job(n_ranks: int, steps: int, slow: dict[int, tuple[str, float]] | None = None, jitter: float = 0.0,
         only_steps: set[int] | None = None, transfer: float = 0.004, seed: int = 0, scale: float = 1.0) -> Records:
    """Synchronous DDP: 10 ms data, 20 ms forward, 30 ms backward compute, 5 ms optimizer, 4 ms transfer. A rank's
    extra work in a phase makes every other rank sit that much longer blocked in the gradient all-reduce."""
    rng = random.Random(seed)
    out: Records = {r: [] for r in range(n_ranks)}
    for s in range(1, steps + 1):
        extra = {r: v for r, v in (slow or {}).items() if only_steps is None or s in only_steps}
        longest = max((d for _, d in extra.values()), default=0.0)
        for r in range(n_ranks):
            ph = {"data": 0.010, "forward": 0.020, "backward": 0.030, "optimizer": 0.005}
            ph = {k: scale * v * (1 + rng.uniform(-jitter, jitter)) for k, v in ph.items()}
            mine = extra[r][1] if r in extra else 0.0
            if r in extra:
                ph[extra[r][0]] += mine
            ph["collective"] = transfer + longest - mine
            out[r].append((s, sum(ph.values()), ph))
    return out


def test_worked_example_by_hand() -> None:
    # docs/metrics.md#caused-wait: 3 ranks, every step rank 0 is blocked 40 ms, rank 1 38 ms, rank 2 5 ms; rank 2's
    # backward compute is 65 ms against the others' 30 ms. Others' median blocked = (40 + 38) / 2 = 39 ms;
    # rank 2's caused wait = 39 - 5 = 34 ms per step; its phase: backward (+35 ms); step = 30+40+10 = 80 ms (ranks 0
    # and 1), 30+5+65 ... every rank's step takes the same 80 ms in a synchronous job.
    recs: Records = {0: [], 1: [], 2: []}
    for s in range(1, 31):
        recs[0].append((s, 0.080, {"data": 0.010, "backward": 0.030, "collective": 0.040}))
        recs[1].append((s, 0.080, {"data": 0.012, "backward": 0.030, "collective": 0.038}))
        recs[2].append((s, 0.080, {"data": 0.010, "backward": 0.065, "collective": 0.005}))
    v = caused_wait(recs)
    (c,) = v.waited_for
    assert c.rank == 2 and c.phase == "backward"
    assert c.cost_s == pytest.approx(0.034)
    assert c.phase_excess_s == pytest.approx(0.035)
    assert c.pct_of_step == pytest.approx(100 * 0.034 / 0.080)
    assert c.others_blocked_s == pytest.approx(0.039) and c.own_blocked_s == pytest.approx(0.005)
    assert v.caused_s == {0: 0.0, 1: 0.0, 2: pytest.approx(0.034)}  # rank 0: 39 - 40 < 0 -> 0
    assert c.steps == (6, 30)  # the first 5 steps are warm-up
    # live split of blocked time: transfer = the least blocked (rank 2's 5 ms), waiting = the rest
    assert v.split_s == {0: (0.040, 0.035, 0.005), 1: (0.038, 0.033, 0.005), 2: (0.005, 0.0, 0.005)}


@pytest.mark.parametrize("phase", ["backward", "forward", "data", "optimizer"])
def test_4096_ranks_one_slow_rank_named_with_its_phase_and_cost(phase: str) -> None:
    n = 4096 if phase == "backward" else 256
    recs = _job(n, 30, slow={123: (phase, 0.030)}, jitter=0.05)
    v = caused_wait(recs)
    assert [c.rank for c in v.waited_for] == [123]
    c = v.waited_for[0]
    assert c.phase == phase and 0.028 < c.cost_s < 0.032 and c.interval.lo > 0.02
    assert c.ranks_compared == n


def test_healthy_4096_ranks_and_a_one_off_are_quiet() -> None:
    assert caused_wait(_job(4096, 30, jitter=0.2)).waited_for == []
    # slow at 4 of the window's 25 steps: a one-off, not a rank that persistently makes the others wait
    assert caused_wait(_job(64, 30, slow={3: ("forward", 0.050)}, only_steps={10, 11, 20, 21})).waited_for == []


def test_without_blocked_times_nothing_is_said() -> None:
    recs = {r: [(s, 0.05, {"forward": 0.01 * (r + 1)}) for s in range(1, 40)] for r in range(4)}
    assert caused_wait(recs).waited_for == []


def test_crowded_host_under_a_few_slices_is_a_note_not_a_slow_rank() -> None:
    # 2.5 ms of caused wait, above the 2 ms floor but under 4 scheduler slices, on a host with fewer cores than ranks
    recs = _job(4, 30, slow={1: ("forward", 0.0025)}, transfer=0.001, scale=0.3)  # 20 ms steps
    assert [c.rank for c in caused_wait(recs).waited_for] == [1]
    v = caused_wait(recs, crowded={r: "4 ranks on 2 cores" for r in range(4)})
    assert v.waited_for == [] and "4 ranks on 2 cores" in v.notes[0] and 0.0025 < 4 * SCHED_SLICE_S


def _starved(extra_work_s: float, runq_s: float, n: int = 2) -> Records:
    """Worked example (docs/metrics.md#caused-wait, "run-queue wait"): 40 ms steps, 10 ms data, 20 ms backward;
    rank 0 needs ``extra_work_s`` more CPU in its forward and waits ``runq_s`` for a CPU (in the same forward), the
    others wait that long in the all-reduce; every rank waits 1 ms for a CPU besides."""
    recs: Records = {r: [] for r in range(n)}
    late = extra_work_s + runq_s
    for s in range(1, 31):
        for r in range(n):
            mine = late if r == 0 else 0.0
            ph = {"data": 0.010, "forward": 0.005 + mine, "backward": 0.020, "collective": 0.005 + late - mine,
                  CPU_WAIT: 0.001 + (runq_s if r == 0 else 0.0)}
            recs[r].append((s, 0.040 + late, ph))
    return recs


def test_a_rank_the_os_kept_off_the_cpu_is_a_note_not_a_slow_rank() -> None:
    # Rank 0 makes the other wait 10 ms a step, all of it waiting for a CPU (11 ms against the other's 1 ms):
    # 10 - 10 = 0 ms of its own lateness, under max(2 ms, 5% of 50 ms) = 2.5 ms.
    v = caused_wait(_starved(0.0, 0.010))
    assert v.waited_for == [] and v.caused_s[0] == pytest.approx(0.010)
    assert "waited 10.00 ms per step longer than they did for a CPU" in v.notes[0] and "0.00 ms is under" in v.notes[0]
    # The same 10 ms of wait from its own work (no run-queue wait beyond the others'): named, cost 10 ms.
    (c,) = caused_wait(_starved(0.010, 0.0)).waited_for
    assert c.rank == 0 and c.cost_s == pytest.approx(0.010) and c.phase == "forward"
    # 8 ms of its own work plus 6 ms for a CPU (a busy rank on a crowded host): named for the whole 14 ms the
    # others wait, since 14 - 6 = 8 ms of its own is over the 2.7 ms threshold (5% of 54 ms).
    (c,) = caused_wait(_starved(0.008, 0.006)).waited_for
    assert c.rank == 0 and c.cost_s == pytest.approx(0.014)
    # 1.5 ms of its own work and 10 ms for a CPU: 1.5 ms is under the threshold, a note.
    v = caused_wait(_starved(0.0015, 0.010))
    assert v.waited_for == [] and "1.50 ms is under" in v.notes[0]
    # The same 10 ms for a CPU, but its own process used 30 ms more CPU a step than the other's (busy threads of its
    # own, the benchmark's straggler-host-contention): the wait is its own doing, nothing is subtracted: named.
    recs = _starved(0.0, 0.010)
    for r, rows in recs.items():
        recs[r] = [(s, t, {**ph, CPU_TIME: 0.030 + (0.030 if r == 0 else 0.0)}) for s, t, ph in rows]
    (c,) = caused_wait(recs).waited_for
    assert c.rank == 0 and c.cost_s == pytest.approx(0.010)
    # Half of it (5 ms more CPU): 10 - (10 - 5) = 5 ms of its own lateness, over 2.5 ms: named.
    for r, rows in recs.items():
        recs[r] = [(s, t, {**ph, CPU_TIME: 0.030 + (0.005 if r == 0 else 0.0)}) for s, t, ph in rows]
    assert [c.rank for c in caused_wait(recs).waited_for] == [0]


def test_probe_counts_ddps_bucket_wait_as_blocked_and_leaves_gradients_alone(tmp_path) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.probes.ledger import LedgerProbe
    from ddpdoctor.probes.steps import StepTracker

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tracker = StepTracker()
    tracker.install()
    probe = LedgerProbe(tracker, 0, tmp_path / "ledger.json")
    try:
        torch.manual_seed(0)
        net = torch.nn.Linear(8, 8)
        x = torch.randn(4, 8)
        ref = torch.autograd.grad(net(x).sum(), list(net.parameters()))
        probe.install()
        model = DDP(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(3):
            opt.zero_grad()
            model(x).sum().backward()
            time.sleep(0.002)
            opt.step()
        assert all(torch.equal(p.grad, g) for p, g in zip(net.parameters(), ref, strict=True))
        step, secs, phases = tracker.last_record or (0, 0.0, {})
        assert step == 3 and phases.get("collective", 0.0) > 0.0  # DDP's finalisation, waited for on this thread
        assert phases["collective"] < secs
        probe.finish({})
        import json

        data = json.loads((tmp_path / "ledger.json").read_text())
        assert [s[0] for s in data["steps"]] == [1, 2, 3]
        assert data["collectives_source"] == "flight-recorder" and data["collectives"]
        assert {c["op"] for c in data["collectives"]} >= {"gloo:all_reduce"}
        grads = [c for c in data["collectives"] if c["op"] == "gloo:all_reduce"]
        assert grads[-1]["bytes"] == 4 * (8 * 8 + 8) and grads[-1]["enqueued_ns"] > 0  # one bucket: weight + bias
    finally:
        probe.uninstall()
        tracker.uninstall()
        dist.destroy_process_group()


def test_live_health_names_the_waited_for_rank_in_alert_status_prometheus_and_tensorboard(tmp_path) -> None:
    import json
    import urllib.request

    from ddpdoctor.live.export import PrometheusExporter, TensorBoardExporter
    from ddpdoctor.live.health import LiveHealth
    from ddpdoctor.live.status import load_status, status_text

    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    health = LiveHealth(tmp_path, world_size=3)
    health.local_ranks = 3
    # rank 2 is 35 ms slower inside backward: its backward phase is as long as theirs (DDP's wait is inside it), but
    # the ledger separates the wait ("collective"): they sit 39 ms blocked, it 4 ms.
    for s in range(1, 41):
        for r in range(3):
            own_bwd, blocked = (0.065, 0.004) if r == 2 else (0.030, 0.039)
            health.ingest(r, [[s, 0.109, {"data": 0.010, "forward": 0.020, "backward": own_bwd, "collective": blocked,
                                          "optimizer": 0.005}]], "forward")
    (alert,) = health.tick(now=1000.0)
    ev = alert["evidence"]
    assert alert["id"] == "slow-rank" and alert["ranks"] == [2] and ev["measured_by"] == "ledger"
    assert (ev["phase"], ev["lost_ms_per_step"], ev["caused_wait_ms_per_step"]) == ("backward", 35.0, 35.0)
    assert "makes the others wait 35.0 ms per step" in alert["title"]
    snap = health.last_snapshot or {}
    assert snap["waited_for"][0]["rank"] == 2
    assert {r: v["caused_wait_ms"] for r, v in snap["ranks"].items()} == {"0": 0.0, "1": 0.0, "2": 35.0}
    assert (snap["ranks"]["0"]["waiting_ms"], snap["ranks"]["0"]["transfer_ms"]) == (35.0, 4.0)
    text = status_text(load_status(tmp_path, now=1000.0))
    assert "waited for: rank 2 in backward, 35.0 ms per step" in text
    exporter = PrometheusExporter("127.0.0.1", 0)
    try:
        exporter.update(health)
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    assert 'ddpdoctor_rank_caused_wait_seconds{rank="2"} 0.035' in body
    tb = TensorBoardExporter(tmp_path / "scalars" / "live")
    tb.update(health)
    tb.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(tmp_path / "scalars" / "live"))
    acc.Reload()
    (last, *_) = reversed(acc.Tensors("live/caused_wait_ms/rank2"))  # tensorboard's own writer: tensor summaries
    assert float(tensor_util.make_ndarray(last.tensor_proto)) == pytest.approx(35.0)

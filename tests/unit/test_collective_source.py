"""The collective source (probes/collectives.py), the phase rules (probes/steps.py) and the hang verdict's
reconciliation of heartbeats, Flight Recorder dumps and stacks (findings/hang.reconcile), issue 36."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from ddpdoctor.analyses.ledger import CPU_WAIT, caused_wait
from ddpdoctor.findings.hang import RankPosition, diagnose_hang, flight_view, reconcile, stack_state
from ddpdoctor.probes.steps import StepTracker, backward_label
from tests.ports import reserve_port

# -- the source, in a one-rank gloo group (a subprocess: a process group is process-wide state) ---------------------
SOURCE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    from ddpdoctor.probes.collectives import CollectiveSource, fr_status
    from ddpdoctor.probes.steps import StepTracker, backward_label
    tracker = StepTracker()
    src = CollectiveSource(tracker)
    src.install()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
    t = torch.ones(4)
    out = {}
    dist.all_reduce(t); out["public"] = src.waits                      # the public function's own work.wait()
    dist.all_reduce(t, async_op=True).wait(); out["async"] = src.waits  # a user's (or FSDP2's) wait
    dist._broadcast_coalesced(dist.group.WORLD, [t], 1 << 20, 0); out["coalesced"] = src.waits  # DDP's buffers
    import torch.distributed._functional_collectives as fc
    y = fc.all_reduce(t, "sum", dist.group.WORLD); y = y + 1; out["functional"] = src.waits
    tracker._account()
    out["blocked_s"] = tracker.phase_s.get("collective", 0.0)
    # The recorder marks a gloo work completed from the backend's thread, a moment after the wait returned: poll.
    import time
    deadline = time.time() + 30
    while True:
        out["status"] = fr_status()
        if all(g["enqueued"] == g["completed"] for g in out["status"].values()) or time.time() > deadline:
            break
        time.sleep(0.05)
    out["kind_after"] = src.kind
    src.uninstall()
    dist.all_reduce(t); out["after_uninstall"] = src.waits
    dist.destroy_process_group()
    print(json.dumps(out))
""")


def test_source_sees_every_python_wait_and_reads_the_flight_recorder() -> None:
    proc = subprocess.run([sys.executable, "-c", SOURCE_SCRIPT, str(reserve_port())], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["public"] == 1 and out["async"] == 2 and out["coalesced"] == 3 and out["functional"] == 4, out
    assert out["blocked_s"] > 0 and out["kind_after"] is None
    assert out["after_uninstall"] == 4  # restored: nothing of the source stays in the job
    (group,) = out["status"].values()
    assert group["enqueued"] >= 4  # every collective, the C++ broadcast's included
    # gloo marks a group's last completed collective lazily (docs/hangs.md): the last one may still read pending.
    assert group["enqueued"] - 1 <= group["completed"] <= group["enqueued"], group


# -- phases ------------------------------------------------------------------------------------------------------------
class Transform(nn.Module):
    def forward(self, x):
        return x * 2


class Images(Dataset):
    def __init__(self, tracker: StepTracker) -> None:
        self.t = Transform()
        self.tracker = tracker
        self.phases: list[str] = []

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        out = self.t(torch.ones(2))
        self.phases.append(self.tracker.phase)
        return out


class Root(nn.Module):  # stands for DDP / fully_shard's FSDPModule
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


def test_only_the_wrapped_models_forward_is_forward_and_loading_is_data() -> None:
    tracker = StepTracker()
    tracker._root_types = (Root,)
    tracker.install()
    try:
        data = Images(tracker)
        model, metric, loss_fn = Root(), Transform(), nn.MSELoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for x in DataLoader(data, batch_size=2):
            seen.append(tracker.phase)  # handed over: still data until the model runs
            out = model(x)
            seen.append(tracker.phase)
            loss = loss_fn(out, x)  # a loss module
            seen.append(tracker.phase)
            loss.backward()
            opt.step()
            metric(out.detach())  # a metric module after the step
            seen.append(tracker.phase)
            model(x).sum().backward()  # the model twice in a step: still one step per optimizer step
        assert data.phases == ["data"] * 4  # transforms inside __getitem__ never switch to forward
        assert seen[:4] == ["data", "forward", "forward", "data"], seen
        assert tracker.step == 2
        # A wrapped model that is not DDP (fully_shard's FSDPModule here): a rank in backward() waits on FSDP's
        # reduce-scatters, not "DDP gradient all-reduce" (findings/crash.py reads that text as DDP's buckets).
        assert tracker.root_kind == "FSDP" and backward_label(tracker) == "backward (FSDP gradient reduce-scatter)"
        # Each iteration's end carries the training thread's run-queue wait (not the first: no reading before it).
        assert (CPU_WAIT in tracker.recent[-1][2]) == os.path.exists("/proc/thread-self/schedstat")
        assert all(0 <= rec[2].get(CPU_WAIT, 0) <= rec[1] + 0.01 for rec in tracker.recent)
    finally:
        tracker.uninstall()


def test_without_a_wrapped_model_any_module_is_forward_but_not_inside_the_loader() -> None:
    tracker = StepTracker()
    tracker._root_types = ()
    tracker.install()
    try:
        data = Images(tracker)
        model = nn.Linear(2, 2)
        for x in DataLoader(data, batch_size=2):
            model(x)
            assert tracker.phase == "forward"
        assert data.phases == ["data"] * 4
        assert tracker.root_kind is None and backward_label(tracker) == "backward"
    finally:
        tracker.uninstall()


# -- the verdict's reconciliation ----------------------------------------------------------------------------------------
PYSPY_WAITING = """Process 9989: python -u bootstrap.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 9989 (idle): "MainThread"
    CollectiveSource._wrap.<locals>.waiting (ddpdoctor/probes/collectives.py:161)
    DistributedDataParallel._distributed_broadcast_coalesced (torch/nn/parallel/distributed.py:2363)
    DistributedDataParallel.forward (torch/nn/parallel/distributed.py:1886)
    train (train.py:84)
Thread 10008 (idle): "ddpdoctor-heartbeat"
    _loop (ddpdoctor/probes/heartbeat.py:300)
"""
TRACEBACK_SLEEPING = """Thread 140 (MainThread):
  File "/srv/train.py", line 90, in <module>
    train()
  File "/srv/train.py", line 40, in stall
    time.sleep(3600)
"""
FAULTHANDLER = 'Thread 0x00007f (most recent call first):\n  File "/srv/train.py", line 40 in stall\n'


def dump(enqueued: int, completed: int, entries: list[tuple[int, str, list[list[int]]]] = ()) -> dict:
    return {"pg_status": {"0": {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(completed),
                                "last_started_collective": "-1"}},
            "entries": [{"collective_seq_id": s, "profiling_name": name, "input_sizes": sizes, "is_p2p": False,
                         "process_group": ["0", "default_pg"]} for s, name, sizes in entries]}


def test_stack_state_reads_py_spy_and_traceback_dumps() -> None:
    assert stack_state(PYSPY_WAITING) == "collective"  # ddpdoctor's own wrapper frame is skipped
    assert stack_state(TRACEBACK_SLEEPING) == "outside"
    assert stack_state(FAULTHANDLER) is None and stack_state(None) is None  # no main thread named: no say


def test_flight_view_names_the_first_pending_collective() -> None:
    v = flight_view(0, dump(14, 12, [(12, "gloo:all_reduce", [[410]]), (13, "gloo:broadcast", [[8]])]))
    assert v is not None and v.completed == {"default_pg": 12}
    p = v.pending["default_pg"]
    assert (p.op, p.seq, p.sizes) == ("broadcast", 13, [[8]])
    assert flight_view(0, {"error": "no recorder"}) is None


def test_reconcile_puts_a_rank_waiting_where_no_wrapper_sees_into_the_collective() -> None:
    # The heartbeats (an older probe, or a wait no wrapper sees) put both ranks outside any collective.
    beats = {0: RankPosition(0, "outside-collective", "forward", 3, call_site="train.py:84"),
             1: RankPosition(1, "outside-collective", "data", 3, call_site="train.py:40")}
    d = diagnose_hang(beats, [0, 1])
    assert d.kind == "unknown"
    out = reconcile(d, {0: PYSPY_WAITING, 1: TRACEBACK_SLEEPING},
                    {0: dump(14, 12, [(13, "gloo:broadcast", [[8]])]), 1: dump(12, 12)})
    assert out.kind == "outside-collective" and out.culprit_ranks == [1]
    assert out.collective == {"op": "broadcast", "seq": 13, "group": "default_pg"}
    assert out.sources == {0: ["flight-recorder", "stack"], 1: ["heartbeat", "flight-recorder", "stack"]}
    assert "sources that agree: flight-recorder, heartbeat, stack" in out.reason


def _retired(d: dict, upto: int) -> dict:
    for e in d["entries"]:
        e["retired"] = e["collective_seq_id"] <= upto
    return d


def test_flight_view_counts_retired_entries_as_completed_as_gloo_marks_them_lazily() -> None:
    # A real gloo dump (a fresh-clone run): last completed 10, enqueued 13, entries 11 and 12 already retired.
    v = flight_view(0, _retired(dump(13, 10, [(11, "gloo:broadcast", [[8]]), (12, "gloo:all_reduce", [[410]]),
                                               (13, "gloo:broadcast", [[8]])]), 12))
    assert v is not None and v.completed == {"default_pg": 12}
    assert (v.pending["default_pg"].op, v.pending["default_pg"].seq) == ("broadcast", 13)
    every = flight_view(0, _retired(dump(12, 10, [(11, "gloo:broadcast", [[8]]), (12, "gloo:all_reduce", [[4]])]), 12))
    assert every is not None and every.completed == {"default_pg": 12} and every.pending == {}


def test_reconcile_takes_the_dumps_newer_number_over_a_heartbeats_lazy_one() -> None:
    # The heartbeat named rank 0's wait from gloo's lazy counters (#11); the dump says #13; the culprit completed 12.
    beats = {0: RankPosition(0, "in-collective", "forward", 3, "broadcast (DDP buffers/parameters)", "default_pg", 11),
             1: RankPosition(1, "outside-collective", "data", 3)}
    out = reconcile(diagnose_hang(beats, [0, 1]), {0: PYSPY_WAITING, 1: TRACEBACK_SLEEPING},
                    {0: _retired(dump(13, 10, [(11, "gloo:broadcast", [[8]]), (12, "gloo:all_reduce", [[4]]),
                                               (13, "gloo:broadcast", [[8]])]), 12),
                     1: _retired(dump(12, 12, [(11, "gloo:broadcast", [[8]]), (12, "gloo:all_reduce", [[4]])]), 12)})
    assert out.kind == "outside-collective" and out.culprit_ranks == [1]
    assert out.collective is not None and out.collective["seq"] == 13
    assert str(out.collective["op"]).startswith("broadcast")
    assert out.sources == {0: ["heartbeat", "flight-recorder", "stack"], 1: ["heartbeat", "flight-recorder", "stack"]}


def test_reconcile_names_the_rank_behind_from_the_flight_recorder_alone() -> None:
    beats = {r: RankPosition(r, "outside-collective", "forward", 3) for r in range(3)}
    out = reconcile(diagnose_hang(beats, [0, 1, 2]), {},
                    {0: dump(21, 20, [(21, "gloo:all_gather", [[36]])]), 1: dump(21, 20, [(21, "gloo:all_gather",
                                                                                           [[36]])]),
                     2: dump(20, 20)})
    assert out.kind == "seq-behind" and out.culprit_ranks == [2]
    assert out.collective == {"op": "all_gather", "seq": 21, "group": "default_pg"}


def test_reconcile_without_dumps_or_stacks_keeps_the_heartbeats_verdict() -> None:
    beats = {0: RankPosition(0, "in-collective", "forward", 3, "broadcast", "default_pg", 13),
             1: RankPosition(1, "outside-collective", "data", 3)}
    d = diagnose_hang(beats, [0, 1])
    out = reconcile(d, {}, {})
    assert out.kind == "outside-collective" and out.culprit_ranks == [1]
    assert out.sources == {0: ["heartbeat"], 1: ["heartbeat"]}


# -- never silence: the ledger's notes ------------------------------------------------------------------------------------
def _steps(n: int, blocked: float, step: float = 0.1) -> list[tuple[int, float, dict[str, float]]]:
    return [(s, step, {"collective": blocked, "forward": step - blocked}) for s in range(1, n + 1)]


def test_ledger_says_when_a_job_is_too_short_to_judge() -> None:
    v = caused_wait({0: _steps(8, 0.05), 1: _steps(8, 0.0)})
    assert v.waited_for == [] and len(v.notes) == 1 and "not judged" in v.notes[0], v.notes


def test_ledger_says_when_a_caused_wait_is_under_its_threshold() -> None:
    # Rank 1 keeps rank 0 waiting 4 ms per 100 ms step: over half the 5 ms threshold, under it.
    v = caused_wait({0: _steps(40, 0.004), 1: _steps(40, 0.0)})
    assert v.waited_for == []
    (note,) = v.notes
    assert "rank 1 kept the others waiting 4.00 ms per step" in note and "threshold 5.00 ms" in note, note


def test_reconcile_names_a_wait_the_heartbeat_had_not_named_from_the_dump() -> None:
    beats = {0: RankPosition(0, "in-collective", "forward", 3, "broadcast (DDP buffers/parameters)", "default_pg", 13,
                             call_site="train.py:84"),
             1: RankPosition(1, "outside-collective", "data", 3, call_site="train.py:40")}
    out = reconcile(diagnose_hang(beats, [0, 1]), {0: PYSPY_WAITING, 1: TRACEBACK_SLEEPING},
                    {0: dump(14, 12, [(13, "gloo:broadcast", [[8]])]), 1: dump(12, 12)})
    assert out.culprit_ranks == [1] and out.collective == {"op": "broadcast", "seq": 13, "group": "default_pg"}
    assert out.positions[0].sizes == [[8]] and out.positions[0].call_site == "train.py:84"
    assert out.sources[0] == ["heartbeat", "flight-recorder", "stack"]


def test_the_fsdp_unit_travels_from_the_beat_to_the_verdict() -> None:
    from ddpdoctor.job.record import RankRecord, decode, encode, record
    from ddpdoctor.job.state import NodeState, diagnose

    unit = "FSDP unit 'layers.1' (Block), forward all-gather on mesh dim 'dp_shard'"
    beat = {"step": 3, "phase": "forward", "time": 10.0, "step_started": 9.0,
            "collective": {"op": "all_gather", "group": "default_pg", "seq": 27, "sizes": [[136]],
                           "call_site": "train.py:190", "unit": unit}}
    waiting = decode(encode([record(0, beat, None, 10.0, 0.0)]))[0]  # through the wire format
    assert waiting.coll is not None and waiting.coll[4] == unit
    node = NodeState(0, ranks=[waiting, RankRecord(1, step=3, phase="data", where="train.py:40")])
    d = diagnose({0: node}, 2, [0, 1])
    assert d.culprit_ranks == [1] and d.collective is not None and d.collective.get("unit") == unit
    assert unit in d.reason and d.to_json()["positions"]["0"].get("unit") == unit

"""The collective ledger on real gloo launches (issue 28): one rank 30 ms slower per step in backward (a gradient hook
that sleeps), forward, data or the optimizer is named by `ddpdoctor run` with the wait it causes and its phase, on one
node and on two; healthy jobs stay quiet, run after run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.e2e.test_multinode import finish, start_nodes

pytestmark = pytest.mark.slow
JOB = str(SCENARIOS / "slow_phase.py")


def _run(out: Path, nproc: int, *job_args: str) -> tuple[int, dict[str, Any], str]:
    proc = run_cli("run", "--nproc-per-node", str(nproc), "-q", "--json", "--out", str(out), JOB, "--steps", "45",
                   *job_args, timeout=300)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _slow(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["id"] == "slow-rank"]


def _named(f: dict[str, Any], rank: int, phase: str) -> None:
    ev = f["evidence"]
    assert f["ranks"] == [rank] and f["severity"] == "warning", f
    assert ev["phase"] == phase and ev["measured_by"] == "ledger", ev
    assert 20 < ev["cost_ms_per_step"] < 45, ev  # 30 ms of extra work per step
    assert ev["cost_ms_per_step"] == ev["caused_wait_ms_per_step"] and ev["cost_pct_of_step"] > 5
    assert ev["interval_ms"]["interval"][0] > 10


def test_rank_slow_in_backward_is_named_by_run_with_cost_phase_and_rank(tmp_path: Path) -> None:
    out = tmp_path / "bwd"
    code, report, stderr = _run(out, 4, "--slow-rank", "3", "--phase", "backward")
    assert code == 0
    (f,) = _slow(report)
    _named(f, 3, "backward")
    assert "slow-rank: rank 3 makes the others wait" in stderr  # said while the job ran
    ledger = json.loads((out / "ranks" / "rank3" / "ledger.json").read_text())
    assert ledger["collectives_source"] == "flight-recorder" and len(ledger["steps"]) == 45
    st = run_cli("status", str(out))
    assert "slow-rank" in st.stdout
    js = json.loads(run_cli("status", str(out), "--json").stdout)
    caused = {r: v["caused_wait_ms"] for r, v in js["health"]["ranks"].items()}
    assert caused["3"] > 20 and max(caused["0"], caused["1"], caused["2"]) < 5, caused


def test_rank_slow_in_backward_on_two_nodes(tmp_path: Path) -> None:
    out = tmp_path / "mn"  # two launchers, 2 ranks each, one --out; rank 3 is on node 1
    procs = start_nodes("run", "slow_phase.py", out, 2, 2, "--json", "--startup-timeout", "300",
                        env={"SLOW_RANK": "3", "SLOW_PHASE": "backward", "SLOW_STEPS": "45"})
    results = finish(procs)
    assert [r[0] for r in results] == [0, 0], [r[2][-2000:] for r in results]
    for _, stdout, _ in results:  # every node's --json tells the job's verdict, judged over all 4 ranks
        report = json.loads(stdout)
        assert report["job"]["world_size"] == 4
        (f,) = _slow(report)
        _named(f, 3, "backward")
        assert f["evidence"]["ranks_compared"] == 4


@pytest.mark.parametrize("phase", ["forward", "data", "optimizer"])
def test_rank_slow_in_other_phases_is_named_with_that_phase(tmp_path: Path, phase: str) -> None:
    code, report, _ = _run(tmp_path / phase, 2, "--slow-rank", "1", "--phase", phase)
    assert code == 0
    (f,) = _slow(report)
    _named(f, 1, phase)


def test_healthy_job_is_quiet_run_after_run(tmp_path: Path) -> None:
    for k in range(2):
        code, report, stderr = _run(tmp_path / f"ok{k}", 4)
        assert code == 0 and not _slow(report), report["findings"]
        assert "slow-rank" not in stderr


@pytest.mark.skipif(len(getattr(os, "sched_getaffinity", lambda _: {0})(0)) < 2, reason="needs 2 CPUs")
def test_a_rank_sharing_its_cpu_with_a_noisy_neighbour_is_not_called_slow(tmp_path: Path) -> None:
    # Rank 0 is pinned to one CPU with 3 busy processes of another program: it waits for that CPU (its phases are
    # longer) and rank 1 waits for it, but its own work is the same. Before the run-queue measure this was a
    # slow-rank warning on rank 0 (8.4 ms, 31% of the step, "slower in backward"); the fault benchmark and CI saw
    # the same on a loaded machine. The wait is the host's: a ledger note, never a slow rank.
    out = tmp_path / "starved"
    code, report, _ = _run(out, 2, "--slow-rank", "0", "--phase", "starved", "--work", "4")
    assert code == 0 and not _slow(report), report["findings"]
    snap = json.loads((out / "live" / "node0" / "health.json").read_text())
    cpu = {r: v["cpu_wait_ms"] for r, v in snap["ranks"].items()}
    assert cpu["0"] > 2 + cpu["1"], cpu  # the probe measured rank 0's wait for its CPU (12.7 vs 0.2 ms once)
    caused = snap["ranks"]["0"]["caused_wait_ms"]
    # Rank 0 did make rank 1 wait (10.2 ms once, said to be the CPU's); above the 2 ms floor that is said in a note.
    assert caused < 2 or any(n.startswith("rank 0 kept the others waiting") for n in report["notes"]), report["notes"]


def test_profile_splits_exposed_communication_into_waiting_for_the_straggler_and_transfer(tmp_path: Path) -> None:
    # The issue's profile: rank 3 named, and the others' "exposed communication" is mostly waiting for it, not
    # transfer to tune buckets for.
    proc = run_cli("profile", "--nproc-per-node", "4", "-q", "--json", "--out", str(tmp_path / "p"), JOB,
                   "--steps", "20", "--slow-rank", "3", "--phase", "backward", timeout=300)
    report = json.loads(proc.stdout)
    ids = {f["id"] for f in report["findings"]}
    assert "straggler-rank" in ids and not ids & {"exposed-comm-high", "bucket-cap-whatif"}, report["findings"]
    (f,) = [f for f in report["findings"] if f["id"] == "straggler-rank"]
    assert f["ranks"] == [3] and 20 < f["evidence"]["cost_ms_per_step"] < 45
    split = {c["rank"]: c for c in report["exposed_split"]}
    for r in (0, 1, 2):
        assert split[r]["wait_ms_per_step"] > 0.6 * split[r]["exposed_ms_per_step"]
        assert set(split[r]["waiting_for_ms_per_step"]) == {"3"}
    assert split[3]["wait_ms_per_step"] < 2


def test_lightning_rank_slow_by_50_ms_is_named_live_and_by_profile(tmp_path: Path) -> None:
    # issue 27's finding: Lightning broadcasts an 8-byte flag every step (arrival order by chance), which diluted the
    # straggler test until a rank last at 11 of 11 gradient all-reduces was not named.
    pytest.importorskip("lightning")
    script = str(SCENARIOS / "lightning_ddp.py")
    args = ("--sleep-rank", "1", "--sleep-ms", "50")
    live = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / "run"), script,
                   "--steps", "60", *args, timeout=400)
    (f,) = _slow(json.loads(live.stdout))
    assert f["ranks"] == [1] and f["evidence"]["measured_by"] == "ledger"
    assert 35 < f["evidence"]["cost_ms_per_step"] < 70
    prof = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / "prof"), script,
                   "--steps", "40", *args, timeout=400)
    (s,) = [f for f in json.loads(prof.stdout)["findings"] if f["id"] == "straggler-rank"]
    assert s["ranks"] == [1] and 35 < s["evidence"]["cost_ms_per_step"] < 70
    assert s["evidence"]["last_in"]["1"].split(" of ")[0] == s["evidence"]["last_in"]["1"].split(" of ")[1]


def test_flight_recorder_source_forced_on_gloo_runs_the_real_reader_and_publishes_every_step(tmp_path: Path) -> None:
    # The NCCL source's machinery (its thread reading torch 2.13's real Flight Recorder, held steps published in
    # order) on a real gloo job. gloo's entries carry no CUDA-event durations, so every held step goes out as a gap
    # with the reason, the caused-wait rule stays silent, and the job and its report are unchanged.
    out = tmp_path / "forced"
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), JOB, "--steps", "30",
                   env={"DDPDOCTOR_LEDGER_SOURCE": "flight-recorder"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert not _slow(report), report["findings"]
    (note,) = [n for n in report["notes"] if n.startswith("collective ledger:")]
    assert "rank(s) 0-1 could not time their collectives" in note and "carry no duration" in note
    for rank in (0, 1):
        ledger = json.loads((out / "ranks" / f"rank{rank}" / "ledger.json").read_text())
        assert ledger["source"].startswith("flight-recorder") and "gloo" in ledger["source_note"]
        steps = ledger["steps"]
        assert [s[0] for s in steps] == list(range(1, 31))  # every step, in order, the held ones included
        assert "ledger_gap" not in steps[0][2]  # decided at step 1's end: held from step 2 on
        assert all("ledger_gap" in s[2] and "collective" not in s[2] for s in steps[1:])
        assert all("host_collective" in s[2] for s in steps[1:])  # DDP's bucket wait, as the host measured it
        fl = ledger["flight"]
        assert fl["steps_without"] == 29 and fl["steps_with_device_time"] == 0 and fl["polls"] >= 1
        assert "carry no duration" in fl["why_without"] and fl["error"] is None
        status = json.loads((out / "ranks" / f"rank{rank}" / "status.json").read_text())
        assert status["ledger"]["source"] == ledger["source"] and "carry no duration" in status["ledger"]["blind"]
        grads = [c for c in ledger["collectives"] if c["op"] == "gloo:all_reduce"]
        assert grads and grads[-1]["bytes"] > 0 and grads[-1]["state"] == "scheduled"

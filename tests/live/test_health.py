"""LiveHealth, the live files, status, stack classes and the exporters, on synthetic beats (no job)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from ddpdoctor.errors import BadInput
from ddpdoctor.launch import runlock
from ddpdoctor.live.export import PrometheusExporter, parse_addr
from ddpdoctor.live.findings import live_findings
from ddpdoctor.live.health import LiveHealth
from ddpdoctor.live.stacks import group_stacks, rank_ranges
from ddpdoctor.live.status import load_status, status_text
from ddpdoctor.rundir.layout import RunDir


def _beats(health: LiveHealth, steps: range, slow_rank: int | None = None) -> None:
    for s in steps:
        for r in range(2):
            fwd = 0.05 if r == slow_rank else 0.01
            wait = 0.01 if r == slow_rank else 0.05
            health.ingest(r, [[s, 0.1, {"data": 0.02, "forward": fwd, "backward": wait + 0.01, "optimizer": 0.01}]],
                          "forward")


def test_slow_rank_alert_files_snapshot_and_findings(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    seen: list[dict] = []
    health = LiveHealth(tmp_path, world_size=2, on_alert=seen.append)
    _beats(health, range(1, 61), slow_rank=1)
    fresh = health.tick(now=1000.0)
    assert [a["id"] for a in fresh] == ["slow-rank"] and seen == fresh
    ev = fresh[0]["evidence"]
    assert (ev["rank"], ev["phase"], ev["lost_ms_per_step"], ev["others_waited_ms_per_step"]) == (1, "forward", 40.0, 40.0)
    assert health.tick(now=1000.5) == []  # not due yet
    assert health.tick(now=1002.0) == []  # raised once while it lasts
    health.finish()
    snap = json.loads((tmp_path / "live" / "node0" / "health.json").read_text())
    assert snap["finished"] and snap["step"] == 60 and snap["world_size"] == 2
    assert snap["slowest_ranks"][0] == 1 and snap["ranks"]["1"]["busy_ms"] == 80.0
    assert len((tmp_path / "live" / "node0" / "series.jsonl").read_text().splitlines()) == 60
    found = live_findings(RunDir(tmp_path))
    assert [(f.id, f.ranks, f.evidence["cost_ms_per_step"]) for f in found] == [("slow-rank", [1], 40.0)]
    st = load_status(tmp_path)
    assert st["state"] == "finished"
    text = status_text(st)
    assert "finished" in text and "slow-rank" in text and "forward" in text


def test_malformed_beats_are_skipped(tmp_path: Path) -> None:
    health = LiveHealth(tmp_path, world_size=2)
    health.ingest(0, "junk")
    health.ingest(0, [[1, "x", {}], [2], None, [3, 0.1, {"data": 0.1}]])
    assert [r.step for r in health.ranks[0]] == [3]


def test_status_of_a_directory_that_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not a ddpdoctor run directory"):
        load_status(tmp_path)
    (tmp_path / "manifest.json").write_text("[" * 100000)
    with pytest.raises(BadInput):
        load_status(tmp_path)


def test_status_of_a_running_job_that_went_quiet(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    health = LiveHealth(tmp_path, world_size=2)
    _beats(health, range(1, 11))
    health.tick(now=1000.0)
    lock = runlock.acquire(tmp_path)  # as the live ddpdoctor holds it
    try:
        assert load_status(tmp_path, now=1001.0)["state"] == "running"
        assert load_status(tmp_path, now=1100.0)["state"] == "stale"
    finally:
        lock.release()
    assert load_status(tmp_path, now=1100.0)["state"] == "unfinished"  # its ddpdoctor is gone (SIGKILL)


def test_stack_classes_smallest_first_with_rank_ranges() -> None:
    a = 'Thread 0x1 (idle): "MainThread"\n    allreduce (x.py:3)\n'
    b = 'Thread 0x9 (idle): "MainThread"\n    load (data.py:7)\n'
    stacks = {r: a.replace("0x1", hex(r + 1)) for r in (0, 1, 2, 4, 5)} | {3: b}
    groups = group_stacks(stacks, {r: {"phase": "data" if r == 3 else "backward", "step": 9} for r in range(6)})
    assert [(g["count"], g["ranks"]) for g in groups] == [(1, "3"), (5, "0-2,4-5")]
    assert "load (data.py:7)" in groups[0]["stack"]
    assert rank_ranges([7, 1, 2, 3, 9]) == "1-3,7,9"


def test_prometheus_endpoint_serves_the_snapshot(tmp_path: Path) -> None:
    health = LiveHealth(tmp_path, world_size=2)
    _beats(health, range(1, 41), slow_rank=1)
    health.tick(now=1000.0)
    exporter = PrometheusExporter("127.0.0.1", 0)
    try:
        exporter.update(health)
        body = urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10).read().decode()
    finally:
        exporter.close()
    assert "ddpdoctor_step 40.0" in body
    assert 'ddpdoctor_rank_busy_seconds{rank="1"} 0.08' in body
    assert 'ddpdoctor_alerts_total{id="slow-rank"} 1.0' in body
    assert parse_addr("[::1]:9464") == ("::1", 9464)
    with pytest.raises(BadInput):
        parse_addr("9464")


def test_status_merges_the_nodes_of_a_shared_run_directory(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"mode": "run", "finished": False}))
    for node, ranks, slow in (("node0", (0, 1), None), ("node1", (2, 3), 3)):
        health = LiveHealth(tmp_path, world_size=4, node=node)
        for s in range(1, 41):
            for r in ranks:
                fwd = 0.05 if r == slow else 0.01
                health.ingest(r, [[s, 0.1, {"forward": fwd, "backward": 0.1 - fwd}]])
        health.tick(now=1000.0)
    lock = runlock.acquire(tmp_path)  # as the live ddpdoctor holds it
    try:
        st = load_status(tmp_path, now=1001.0)
    finally:
        lock.release()
    h = st["health"]
    assert st["state"] == "running" and h["nodes"] == ["node0", "node1"]
    assert sorted(h["ranks"]) == ["0", "1", "2", "3"] and h["slowest_ranks"][0] == 3
    assert [a["ranks"] for a in h["alerts"]] == [[3]]  # node1's monitor compared its own two ranks
    assert [f.ranks for f in live_findings(RunDir(tmp_path))] == [[3]]


def test_the_monitor_takes_only_its_owners_regular_small_requests(tmp_path: Path) -> None:
    import os

    from ddpdoctor.live.watch import LiveWatch, control_dir

    watch = LiveWatch()
    watch.root, watch.node = tmp_path, "node0"
    ctl = control_dir(tmp_path, "node0")
    ctl.mkdir(parents=True)
    good = {"id": "a", "what": "profile", "steps": 3}
    (ctl / "req-a.json").write_text(json.dumps(good))
    (ctl / "req-big.json").write_text(json.dumps(dict(good, pad="x" * 5000)))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(dict(good, id="via-link")))
    (ctl / "req-link.json").symlink_to(secret)
    os.mkfifo(ctl / "req-fifo.json")
    foreign = ctl / "req-foreign.json"
    foreign.write_text(json.dumps(dict(good, id="foreign")))
    if os.getuid() == 0:
        os.chown(foreign, 65534, 65534)  # another user's file in the folder: never acted on
    taken = watch._take_requests()
    assert [r["id"] for r in taken] == ["a"] + ([] if os.getuid() == 0 else ["foreign"])
    assert secret.exists() and not list(ctl.iterdir())  # every entry taken once; a link's target untouched

"""The watch sees every collective, wherever it is called from (issue 36): real gloo launches of
tests/scenarios/watch_shapes.py under `ddpdoctor run` at the default settings (the 60 s floor scaled to 5 s, as the
suite does: $DDPDOCTOR_DEFAULT_HANG_TIMEOUT) and `ddpdoctor profile`.

- a hang where the waiting rank is in a collective no call of the script's own makes: DDP's buffer broadcast
  (BatchNorm CNN; BERT-like position_ids under a framework-style engine) and FSDP2's all-gather: the culprit, the
  collective, and the sources that agree;
- a straggler whose wait falls in the buffer broadcast: named by `run` and by `profile` with its cost;
- healthy variants stay quiet; data loading with transform modules is "data", not "forward"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SCENARIOS, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="watch_sources")]
JOB = SCENARIOS / "watch_shapes.py"
ENV = {"DDPDOCTOR_DEFAULT_HANG_TIMEOUT": "5", "SCENARIO_GLOO_TIMEOUT": "120"}
STEPS = "30"


def _launch(out: Path, command: str, model: str, fault: str) -> tuple[int, dict[str, Any]]:
    proc = run_cli(command, "--nproc-per-node", "2", "-q", "--json", "--out", str(out), str(JOB), model, fault, STEPS,
                   env=ENV, timeout=300)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, str], tuple[int, dict[str, Any], Path]]:
    """Every launch once, shared by the tests below (about 2 minutes on 2 loaded cores)."""
    base = tmp_path_factory.mktemp("watch")
    out = {}
    for command, model, fault in [("run", "bn", "hang"), ("run", "bert", "hang"), ("run", "fsdp", "hang"),
                                  ("run", "bn", "slow"), ("profile", "bn", "slow"),
                                  ("run", "bn", "slowdata"), ("run", "bert", "none"), ("run", "fsdp", "none")]:
        d = base / f"{command}-{model}-{fault}"
        code, report = _launch(d, command, model, fault)
        out[(command, model, fault)] = (code, report, d)
    return out


def _by_id(report: dict[str, Any], fid: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["id"] == fid]


def _line(text: str) -> str:
    for i, line in enumerate(JOB.read_text().splitlines(), 1):
        if text in line:
            return f"{JOB}:{i}"
    raise AssertionError(text)


@pytest.mark.parametrize(("model", "op", "site"), [
    ("bn", "broadcast", "loss = loss_fn(model(x), y)"),  # DDP's buffer broadcast, from C++
    ("bert", "broadcast", "loss_fn(model(ids[:4]), y[:4]).backward()"),  # position_ids, under an engine's loop
    ("fsdp", "all_gather", "loss = nn.functional.cross_entropy(model(x), y)"),  # FSDP2's work.wait()
])
def test_hang_in_an_unwrapped_collective_names_the_culprit(runs: Any, model: str, op: str, site: str) -> None:
    code, report, out = runs[("run", model, "hang")]
    assert code == 1
    (hang,) = _by_id(report, "hang")
    ev = hang["evidence"]
    assert ev["culprit_ranks"] == [1], hang["title"]
    assert ev["collective"]["op"] == op and ev["collective"]["group"] == "default_pg", ev["collective"]
    assert ev["call_sites"]["1"] == _line("time.sleep(3600)")  # the culprit's own line
    assert ev["call_sites"]["0"] == _line(site)  # where the waiting rank entered the collective
    diagnosis = json.loads((out / "hang.json").read_text())["diagnosis"]
    assert diagnosis["kind"] == "outside-collective"
    # Heartbeats, the Flight Recorder and the stacks agree on both ranks, and the verdict says so.
    assert diagnosis["sources"] == {"0": ["heartbeat", "flight-recorder", "stack"],
                                    "1": ["heartbeat", "flight-recorder", "stack"]}
    assert "sources that agree: flight-recorder, heartbeat, stack" in hang["title"]
    if model == "fsdp":  # the unit whose all-gather rank 0 waits in: the second block, in its forward
        assert ev["collective"]["unit"] == "FSDP unit '1' (Block), forward all-gather", ev["collective"]


def test_straggler_waited_for_in_the_buffer_broadcast_is_named_by_run(runs: Any) -> None:
    code, report, _ = runs[("run", "bn", "slow")]
    (slow,) = _by_id(report, "slow-rank")
    ev = slow["evidence"]
    assert slow["ranks"] == [1] and ev["phase"] == "data", ev  # the sleep is in its data loading
    assert 25 < ev["cost_ms_per_step"] < 100, ev  # 50 ms per step


def test_straggler_waited_for_in_the_buffer_broadcast_is_named_by_profile(runs: Any) -> None:
    code, report, _ = runs[("profile", "bn", "slow")]
    (st,) = _by_id(report, "straggler-rank")
    assert st["ranks"] == [1], st
    assert 25 < st["evidence"]["cost_ms_per_step"] < 100, st["evidence"]


@pytest.mark.parametrize(("model", "fault"), [("bn", "slowdata"), ("bert", "none"), ("fsdp", "none")])
def test_healthy_variants_are_quiet(runs: Any, model: str, fault: str) -> None:
    code, report, out = runs[("run", model, fault)]
    assert code == 0, report["findings"]
    assert not [f for f in report["findings"] if f["severity"] in ("warning", "error")], report["findings"]
    status = json.loads((out / "ranks" / "rank0" / "status.json").read_text())
    assert status["steps_completed"] == int(STEPS)  # the engine's twice-called model: one step per optimizer step


def test_data_loading_with_transform_modules_is_data_not_forward(runs: Any) -> None:
    """Transforms that are nn.Modules run in __getitem__ (2 ms a sample, 16 ms a batch); the loss and metric modules
    run outside the model: none of them is the model's forward."""
    _, _, out = runs[("run", "bn", "slowdata")]
    (health,) = (out / "live").glob("*/health.json")
    for rank, state in json.loads(health.read_text())["ranks"].items():
        share = state["phase_share"]
        assert share["data"] > 0.25 and share["data"] > 2 * share.get("forward", 0.0), (rank, share)

"""A run directory is a TensorBoard log dir: a real `tensorboard` serves ddpdoctor's scalars and the traces."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ddpdoctor.renderers.tensorboard import write_scalars
from tests.views_fixtures import profiled_run, sections

# One worker runs both view e2e modules, so they share one profiled run (tests/views_fixtures.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="views_profiled_run")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tensorboard_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("tensorboard")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("tensorboard")
    if not found:
        pytest.skip("tensorboard not installed")
    return [found]


class TensorBoard:
    def __init__(self, logdir: Path) -> None:
        self.port = _free_port()
        self.log = (logdir.parent / "tensorboard.log").open("w")
        self.proc = subprocess.Popen(
            [*_tensorboard_cmd(), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(self.port),
             "--reload_interval", "1"], stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path: str, **params: str) -> object:
        url = f"http://127.0.0.1:{self.port}/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return json.loads(resp.read())

    def wait_for(self, path: str, ok, timeout: float = 90.0, **params: str) -> object:
        """Poll until ``ok(answer)``: TensorBoard loads runs (and the profiler plugin parses traces) lazily."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "tensorboard exited"
            try:
                last = self.get(path, **params)
                if ok(last):
                    return last
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{path} {params}: last answer {last!r}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def logdir() -> Path:
    """logs/run: a real 2-rank profile run; logs/fixture: scalars of the hand-written sections."""
    root = profiled_run().parent
    write_scalars(sections(), root / "fixture" / "scalars", wall_time=1_700_000_000.0)
    return root


@pytest.fixture(scope="module")
def tb(logdir):
    server = TensorBoard(logdir)
    yield server
    server.stop()


def _values(tb: TensorBoard, run: str, tag: str) -> dict[int, float]:
    points = tb.wait_for("data/plugin/scalars/scalars", lambda a: isinstance(a, list) and a, run=run, tag=tag)
    return {step: value for _wall, step, value in points}


def test_scalars_of_the_fixture(tb):
    tags = tb.wait_for("data/plugin/scalars/tags", lambda a: "fixture/scalars/rank1" in a)
    assert set(tags["fixture/scalars/rank0"]) == {
        "ddpdoctor/step_time_ms", "ddpdoctor/compute_ms", "ddpdoctor/comm_ms", "ddpdoctor/exposed_comm_ms",
        "ddpdoctor/overlap_pct"}
    # tests/fixtures/views/README.md: rank 0's steps 3, 4, 5 last 40, 54 and 30.6 ms; step 3 exposes 12 ms of
    # 23 ms of communication, 11 ms overlapped = 47.83 %.
    step = _values(tb, "fixture/scalars/rank0", "ddpdoctor/step_time_ms")
    assert step == pytest.approx({3: 40.0, 4: 54.0, 5: 30.6})
    assert _values(tb, "fixture/scalars/rank0", "ddpdoctor/exposed_comm_ms")[3] == pytest.approx(12.0)
    assert _values(tb, "fixture/scalars/rank0", "ddpdoctor/comm_ms")[3] == pytest.approx(23.0)
    assert _values(tb, "fixture/scalars/rank0", "ddpdoctor/overlap_pct")[3] == pytest.approx(47.83, abs=1e-3)
    assert _values(tb, "fixture/scalars/rank1", "ddpdoctor/step_time_ms") == pytest.approx({3: 41.5, 4: 54.4, 5: 31.0})


def test_scalars_profile_wrote_match_its_report(tb, logdir):
    report = json.loads((logdir / "run" / "report.json").read_text())
    per_rank = {r["rank"]: r.get("per_step") or [] for r in report["ranks"]}
    if not any(per_rank.values()):
        # An analysis without per-step numbers must write no scalars rather than invented ones.
        assert not list((logdir / "run" / "scalars").rglob("events.out.tfevents.*"))
        return
    for rank, steps in per_rank.items():
        got = _values(tb, f"run/scalars/rank{rank}", "ddpdoctor/step_time_ms")
        assert got == pytest.approx({s["step"]: s["dur_us"] / 1000 for s in steps}, rel=1e-6)


def test_profiler_plugin_reads_the_run(tb):
    runs = tb.wait_for("data/plugin/pytorch_profiler/runs", lambda a: "run/traces" in a.get("runs", []))
    assert "run/traces" in runs["runs"]
    assert "Distributed" in tb.get("data/plugin/pytorch_profiler/views", run="run/traces")
    workers = tb.get("data/plugin/pytorch_profiler/workers", run="run/traces", view="Overview")
    assert sorted(workers) == ["rank0", "rank1"]
    span = tb.get("data/plugin/pytorch_profiler/spans", run="run/traces", worker="rank0")[0]
    overlap = tb.get("data/plugin/pytorch_profiler/distributed/overlap", run="run/traces", worker="All", span=span)
    assert overlap["metadata"]["legends"] == ["Computation", "Overlapping", "Communication", "Other"]
    # Per rank the plugin splits each profiled step into computation/overlap/communication/other (us).
    assert set(overlap["data"]["all"]) == {"rank0", "rank1"}
    assert all(len(v) == 4 and v[2] > 0 for v in overlap["data"]["all"].values())
    commops = tb.get("data/plugin/pytorch_profiler/distributed/commops", run="run/traces", worker="All", span=span)
    names = {row[0] for row in commops["data"]["rank0"]["rows"]}
    assert "gloo:all_reduce" in names

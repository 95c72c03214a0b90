"""A run directory is a TensorBoard log dir: a real `tensorboard` serves ddpdoctor's scalars (with descriptions) and
ddpdoctor's own tab (runs, report, all-ranks timeline), checked over HTTP and in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from ddpdoctor.renderers.tensorboard import write_scalars
from ddpdoctor.reports.sections import PerfSection
from tests.ports import reserve_port
from tests.views_fixtures import profiled_run, sections

# One worker runs both view e2e modules, so they share one profiled run (tests/views_fixtures.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="views_profiled_run")]


def _free_port() -> int:
    return reserve_port()  # reserved until the server binds it (tests/ports.py), not bound and released


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
    write_scalars(PerfSection.from_json(sections()), root / "fixture" / "scalars", wall_time=1_700_000_000.0)
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


def _raw(tb: TensorBoard, path: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{tb.port}/{path}", timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_scalars_carry_descriptions(tb):
    tags = tb.wait_for("data/plugin/scalars/tags", lambda a: "fixture/scalars/rank0" in a)
    described = tags["fixture/scalars/rank0"]
    assert "hidden behind compute" in described["ddpdoctor/overlap_pct"]["description"]
    assert all(v["description"] for v in described.values())


def test_ddpdoctor_tab_is_installed_and_its_routes_answer(tb):
    from importlib.metadata import entry_points

    assert any(ep.name == "ddpdoctor" for ep in entry_points(group="tensorboard_plugins"))
    listing = tb.wait_for("data/plugins_listing", lambda a: a.get("ddpdoctor", {}).get("enabled"))
    tab = listing["ddpdoctor"]
    assert tab["tab_name"] == "ddpdoctor" and tab["loading_mechanism"]["type"] == "IFRAME"
    runs = tb.wait_for("data/plugin/ddpdoctor/runs", lambda a: a.get("runs"))["runs"]
    assert [r["run"] for r in runs] == ["run"]  # logs/fixture holds scalars only: not a run directory
    row = runs[0]
    assert row["command"] == "profile" and row["ranks"] == 2 and row["has_traces"] and row["exit_code"] == 0
    status, headers, body = _raw(tb, "data/plugin/ddpdoctor/report?run=run")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self' 'unsafe-eval' 'sha256-" in headers["Content-Security-Policy"]
    assert b"ddpdoctor profile" in body and b'id="ranks"' in body
    timeline = tb.get("data/plugin/ddpdoctor/timeline", run="run")
    assert [r["rank"] for r in timeline["ranks"]] == [0, 1] and timeline["events"] > 100
    names = timeline["names"]
    for rank in timeline["ranks"]:
        assert any(names[e[3]].startswith("ProfilerStep#") for t in rank["tracks"] for e in t["events"])
    # a run is named only as the listing names it: no paths from the URL
    for bad in ("../run", "/etc", "run/traces", ""):
        assert _raw(tb, "data/plugin/ddpdoctor/timeline?" + urllib.parse.urlencode({"run": bad}))[0] == 404
    status, headers, body = _raw(tb, "data/plugin/ddpdoctor/index.js")
    assert status == 200 and b"export async function render" in body
    assert b"http://" not in body and b"https://" not in body  # nothing is fetched from elsewhere


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium not installed (scripts/install-chromium.sh installs it)")


def _browse(url: str, tmp: Path, width: int, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
            f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", f"--window-size={width},1600",
            "--virtual-time-budget=20000", *extra, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_ddpdoctor_tab_in_chromium(tb, tmp_path):
    tb.wait_for("data/plugin/ddpdoctor/timeline", lambda a: a.get("ranks"), run="run")  # parsed once: a fast load
    entry = f"http://127.0.0.1:{tb.port}/data/plugin_entry.html?name=ddpdoctor&view=timeline"
    proc = _browse(entry, tmp_path, 1400, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-runs="1"' in body and 'data-timeline="1"' in body, body
    canvas = re.search(r"<canvas[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in canvas and int(re.search(r'data-drawn="(\d+)"', canvas).group(1)) > 100
    assert 'id="report-frame"' in dom
    errors = [line for line in proc.stderr.splitlines() if "Uncaught" in line or "Refused to" in line]
    assert errors == [], errors
    shots = Path(os.environ.get("DDPDOCTOR_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    out = shots / "tensorboard-ddpdoctor-timeline.png"
    assert _browse(entry, tmp_path, 1400, f"--screenshot={out}").returncode == 0 and out.stat().st_size > 10_000
    for width in (1400, 800):
        out = shots / f"tensorboard-ddpdoctor-{width}.png"
        proc = _browse(f"http://127.0.0.1:{tb.port}/?darkMode=false#ddpdoctor", tmp_path, width,
                       f"--screenshot={out}")
        assert proc.returncode == 0 and out.stat().st_size > 10_000, proc.stderr[-2000:]

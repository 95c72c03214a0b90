"""The HTML report in a real headless Chromium: charts render, no console errors, injected markup stays inert."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ddpdoctor.renderers.html import write_html
from tests.views_fixtures import evil_report, profiled_run

# One worker runs both view e2e modules, so they share one profiled run (tests/views_fixtures.py).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="views_profiled_run")]

# The payload writes to the DOM if it ever runs, so the dumped DOM shows it (an attribute, not text).
PWNED = "data-pwned"
EVIL_DOM = (f"<script>document.body.setAttribute('{PWNED}','1')</script>"
            f"<img src=x onerror=\"document.body.setAttribute('{PWNED}','2')\">")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("chromium not installed (scripts/install-chromium.sh installs it)")


def _browse(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Load ``page`` in a headless Chromium that touches no network and keeps no state outside ``tmp``."""
    args = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions",
        f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", "--window-size=1400,2400",
        *extra, page.resolve().as_uri(),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=90)


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def _dom(page: Path, tmp: Path) -> str:
    proc = _browse(page, tmp, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _console_lines(proc.stderr) == [], "console output: " + "\n".join(_console_lines(proc.stderr))
    return proc.stdout


def _count(dom: str, cls: str) -> int:
    return len(re.findall(rf'<rect[^>]*class="{cls}"', dom))


def test_fixture_report_renders_and_markup_stays_inert(tmp_path):
    report = evil_report()
    s = report.sections
    s["collectives"]["calls"][0]["op"] = EVIL_DOM
    s["collectives"]["matched"][0]["op"] = EVIL_DOM
    s["run_dir"] = EVIL_DOM
    page = write_html(report, tmp_path / "report.html")
    dom = _dom(page, tmp_path)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-rendered="1"' in body
    assert f'{PWNED}="' not in dom and "data-error=" not in dom
    assert "<img" not in dom
    for chart in ("chart-timeline", "chart-overlap", "chart-stragglers", "chart-steps", "chart-whatif", "chart-buckets"):
        tag = re.search(rf'<div[^>]*id="{chart}"[^>]*>', dom).group(0)
        assert 'data-rendered="1"' in tag, chart
    # step time per step and rank: 2 lines of 3 points; the straggler (rank 1) is dashed, not red
    assert len(re.findall(r'<polyline[^>]*class="step-line"', dom)) == 2 and _count(dom, "step-point") == 0
    assert len(re.findall(r'<circle[^>]*class="step-point"', dom)) == 6
    assert 'fill="#dc2626" class="st-bar"' not in dom and "#dc2626" not in " ".join(
        re.findall(r'<rect[^>]*class="st-bar"[^>]*>', dom))
    # bucket sizes against backward: rank 0's first step, 2 buckets; the last one outlasts backward (exposed part)
    assert _count(dom, "bk-bar") == 2 and _count(dom, "bk-exposed") >= 1
    # Hand-written fixture: the slowest step of rank 0 is step 4; 2 ranks x 2 buckets, one last bucket each.
    assert '<option value="4">step 4</option>' in dom.replace(' selected=""', "")
    assert _count(dom, "tl-bucket") == 4 and _count(dom, "tl-backward") == 2 and _count(dom, "tl-step") == 2
    assert _count(dom, "ov-bar") == 2 and _count(dom, "ex-bar") == 2
    # waits per rank (2) + median step per rank (2) + arrival skew per matched collective (6)
    assert _count(dom, "st-bar") == 10
    # the payload is shown as text inside the charts' SVG (escaped by the DOM serialiser)
    assert "last: rank 1 (&lt;script&gt;document.body.setAttribute" in dom

    for width in (1400, 800):  # a wide screen and a narrow window
        shot = tmp_path / f"report-{width}.png"
        proc = _browse(page, tmp_path, f"--screenshot={shot}", f"--window-size={width},2400")
        assert proc.returncode == 0 and shot.stat().st_size > 20_000, proc.stderr[-2000:]
        if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):  # for a person to look at
            shutil.copy(shot, Path(os.environ["DDPDOCTOR_SCREENSHOT_DIR"]) / f"report-fixture-{width}.png")


def test_real_profile_report_renders(tmp_path):
    run = profiled_run()
    page = run / "report.html"
    assert page.is_file() and (run.parents[1] / "extra.html").read_text() == page.read_text()
    dom = _dom(page, tmp_path)
    assert 'data-rendered="1"' in re.search(r"<body[^>]*>", dom).group(0)
    assert "data-error=" not in dom
    assert "<svg" in dom
    if os.environ.get("DDPDOCTOR_SCREENSHOT_DIR"):
        _browse(page, tmp_path, f"--screenshot={Path(os.environ['DDPDOCTOR_SCREENSHOT_DIR']) / 'report-real.png'}")


def test_profile_merge_option_writes_one_trace():
    run = profiled_run()
    merged = json.loads(gzip.decompress((run.parents[1] / "merged.json.gz").read_bytes()))
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert sorted(names) == [0, 1] and all(n.startswith(f"rank {p}") for p, n in names.items())
    per_rank = {p: sum(1 for e in merged["traceEvents"] if e.get("pid") == p and e.get("name") == "gloo:all_reduce")
                for p in (0, 1)}
    assert per_rank[0] == per_rank[1] > 0  # every bucket all_reduce of both ranks is in the one trace

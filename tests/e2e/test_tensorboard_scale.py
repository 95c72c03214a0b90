"""The TensorBoard tab on a 1,024-rank analysis (tests/big_job.py), in a real `tensorboard` and headless Chromium:
the ranks are shown as the ranks that matter and classes with ranges, the timeline draws a handful of ranks, and no
table of the tab or of its report has a row per rank unless unfolded."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.big_job import RANKS, STRAGGLER, big_run
from tests.e2e.test_tensorboard import TensorBoard, _browse, _raw

# One worker runs the module (one server), and every test starts once the server lists the run.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="tb_big_job")]


@pytest.fixture(scope="module")
def tb_big(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("tb-big") / "logs"
    big_run(logdir / "big")
    server = TensorBoard(logdir)
    try:
        server.wait_for("data/plugin/ddpdoctor/runs", lambda a: a.get("runs"))
        yield server
    finally:
        server.stop()


def test_routes_group_a_big_job(tb_big):
    runs = tb_big.wait_for("data/plugin/ddpdoctor/runs", lambda a: a.get("runs"))["runs"]
    assert [r["run"] for r in runs] == ["big"] and runs[0]["ranks"] == RANKS
    data = tb_big.wait_for("data/plugin/ddpdoctor/timeline", lambda a: a.get("ranks"), run="big")
    drawn = [r["rank"] for r in data["ranks"]]
    assert STRAGGLER in drawn and len(drawn) <= 8 and data["traces_not_read"] == RANKS - len(drawn)
    asked = tb_big.get("data/plugin/ddpdoctor/timeline", run="big", ranks="600-603")
    assert [r["rank"] for r in asked["ranks"]] == [600, 601, 602, 603]
    for bad in ("abc", "9-1", "0-" + "9" * 30):
        status, _, body = _raw(tb_big, f"data/plugin/ddpdoctor/timeline?run=big&ranks={bad}")
        assert status == 400 and b"ranks" in body


def _rows_outside_details(html: str) -> int:
    return len(re.findall(r"<tr[ >]", re.sub(r"<details>.*?</details>", "", html, flags=re.S)))


def test_the_report_of_a_big_job_reads_on_one_screen(tb_big):
    status, _, body = _raw(tb_big, "data/plugin/ddpdoctor/report?run=big")
    page = body.decode()
    assert status == 200 and "896-1023" in page and "straggler" in page
    # the per-rank table: every rank's row exists, folded away; unfolded, the ranks that matter and the classes
    ranks = re.search(r'<section id="ranks".*?</section>', page, re.S).group(0)
    assert len(re.findall(r"<tr[ >]", ranks)) > RANKS
    assert _rows_outside_details(ranks) < 12


def test_big_job_tab_in_chromium(tb_big, tmp_path):
    tb_big.wait_for("data/plugin/ddpdoctor/timeline", lambda a: a.get("ranks"), run="big")
    entry = f"http://127.0.0.1:{tb_big.port}/data/plugin_entry.html?name=ddpdoctor&view=timeline"
    proc = _browse(entry, tmp_path, 1400, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-runs="1"' in body and 'data-timeline="1"' in body, body
    table = re.search(r'<table class="runs" id="rank-classes-table">.*?</table>', dom, re.S).group(0)
    rows = re.findall(r'<tr class="(single|class)">(.*?)</tr>', table, re.S)
    assert 3 <= len(rows) <= 8
    text = " | ".join(re.sub(r"<[^>]+>", " ", r) for _, r in rows)
    assert "0-512,514-895" in text and "896-1023" in text and "straggler" in text, text
    canvas = re.search(r"<canvas[^>]*>", dom).group(0)
    shown = [int(x) for x in re.search(r'data-ranks="([\d,]+)"', canvas).group(1).split(",")]
    assert STRAGGLER in shown and len(shown) <= 8
    assert 'data-rendered="1"' in canvas and int(re.search(r'data-drawn="(\d+)"', canvas).group(1)) > 100
    assert len(re.findall(r"<tr[ >]", dom)) < 40  # the tab itself: no row per rank anywhere
    errors = [line for line in proc.stderr.splitlines() if "Uncaught" in line or "Refused to" in line]
    assert errors == [], errors
    shots = Path(os.environ.get("DDPDOCTOR_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    out = shots / "tensorboard-ddpdoctor-1024-ranks.png"
    assert _browse(entry, tmp_path, 1400, f"--screenshot={out}").returncode == 0 and out.stat().st_size > 10_000

"""The HTML report: self-contained, every trace-derived string inert, charts fed with the report's numbers."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from ddpdoctor.renderers.html import render_html, script_json
from ddpdoctor.report import Report
from tests.views_fixtures import EVIL, evil_report, findings, sections


class _Doc(HTMLParser):
    """Collects the real elements a browser's parser would build (tags, attributes, script bodies)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data
        else:
            self.text.append(data)


def _parse(text: str) -> _Doc:
    doc = _Doc()
    doc.feed(text)
    doc.close()
    return doc


def test_markup_in_trace_names_stays_text():
    text = render_html(evil_report())
    doc = _parse(text)
    # Only our own elements exist: three scripts (error hook, data, charts) and no <img> at all.
    assert [t for t, _ in doc.tags].count("script") == 3
    assert "img" not in [t for t, _ in doc.tags]
    assert not any(k.startswith("on") for _, attrs in doc.tags for k in attrs)
    # The markup is shown to the reader as text (in the findings, tables, notes and header) ...
    shown = "".join(doc.text)
    assert shown.count(EVIL) >= 6
    # ... and survives the round trip through the embedded data unchanged, for the charts to show as text.
    data = json.loads(doc.scripts[1])
    assert data["collectives"]["calls"][0]["op"] == EVIL
    assert data["collectives"]["matched"][0]["op"] == EVIL


def test_embedded_json_cannot_close_its_script():
    payload = {"name": "</script><script>alert(1)</script><!--", "sep": "a\u2028b"}
    text = script_json(payload)
    assert "<" not in text and ">" not in text and "\u2028" not in text
    assert json.loads(text) == payload


def test_self_contained_no_network():
    text = render_html(Report(command="analyze", sections=sections(), findings=findings()))
    # No external resource of any kind: every src/href is absent, and the CSP forbids fetching.
    assert not re.search(r"""\b(src|href)\s*=""", text)
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text
    assert "default-src 'none'" in text


def test_report_numbers_reach_the_page():
    text = render_html(Report(command="analyze", sections=sections(), findings=findings()))
    doc = _parse(text)
    shown = " ".join(doc.text)
    # Per-rank table, worked out by hand in tests/fixtures/views/README.md: rank 0 median step 40.00 ms,
    # exposed 41.00 ms over 3 steps = 13.67 ms per step, 32.9 % of step time, overlap 43.1 %; rank 1 straggles.
    assert "40.00" in shown and "13.67" in shown and "32.9%" in shown and "43.1%" in shown
    assert "1 (straggler)" in shown
    assert "Straggler rank(s): 1." in shown
    ids = {attrs.get("id") for _, attrs in doc.tags}
    assert {"chart-timeline", "chart-overlap", "chart-stragglers", "chart-steps", "chart-whatif", "chart-buckets",
            "summary", "ddpdoctor-data"} <= ids
    # The summary strip: verdict with the worst finding's title as the why, ranks, steps recorded.
    assert shown.index("error") < shown.index("Rank 1 arrives last") < shown.index("Findings")
    assert "3 per rank (steps 3-5)" in shown
    # Tables say per step; the terms they use are defined where they are used.
    assert "Every figure is per step" in shown and "step ms (median)" in shown
    for term in ("overlap", "exposed communication", "arrival skew", "caused wait"):
        assert f"<dt>{term}</dt>" in text
    # Errors first: the error finding is listed before the warning.
    assert shown.index("Rank 1 arrives last") < shown.index("Exposed communication is 33%")


def test_rank_without_communication_and_nan():
    s = sections()
    r = s["ranks"][0]
    r.update(comm_us=0.0, overlap_us=0.0, overlap_pct=None, exposed_comm_us=0.0, exposed_comm_pct=0.0)
    r["idle_us"] = float("nan")  # must never reach the page as NaN (JSON has no NaN)
    text = render_html(Report(command="analyze", sections=s))
    doc = _parse(text)
    assert "no comm" in " ".join(doc.text)
    assert "nan" not in " ".join(doc.text).lower()
    data = json.loads(doc.scripts[1])
    assert data["ranks"][0]["idle_us"] is None
    assert "NaN" not in doc.scripts[1]


def test_empty_report_renders():
    text = render_html(Report(command="analyze"))
    doc = _parse(text)
    assert "No findings." in " ".join(doc.text)
    assert json.loads(doc.scripts[1])["ranks"] == []


def test_a_failed_write_keeps_the_previous_report_whole(tmp_path):
    import resource
    import signal

    import pytest

    from ddpdoctor.renderers.html import write_html

    target = tmp_path / "report.html"
    write_html(evil_report(), target)
    before = target.read_text()
    # A real OSError mid-write: the file-size limit stops the temporary file after 512 bytes (EFBIG; SIGXFSZ
    # ignored so that the write fails instead of killing the process). The temporary name is unpredictable, so
    # nothing can be planted in its place.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, hard))
    try:
        with pytest.raises(OSError):
            write_html(Report(command="analyze"), target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no temporary file left behind
    assert target.read_text() == before  # not truncated, not half a page

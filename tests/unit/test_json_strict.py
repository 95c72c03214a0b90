"""--json never carries NaN/Infinity or a lone surrogate, and a live run's health file with a field of the wrong
type, a NaN or a lone surrogate is shown, never a traceback (issue 26, item 13)."""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest

from ddpdoctor import safe_io
from ddpdoctor.launch import runlock
from ddpdoctor.safe_io import dumps_json, iter_json, loads_json
from tests.conftest import SAMPLE_RUN, run_cli


def strict(text: str) -> object:
    """What a strict JSON reader (jq, serde, JSON.parse) accepts: no NaN/Infinity, no lone surrogate."""

    def refuse(const: str) -> None:
        raise AssertionError(f"{const} in JSON output")

    value = json.loads(text, parse_constant=refuse)
    text.encode("utf-8")  # a decoded lone surrogate would raise here

    def walk(v: object) -> None:
        if isinstance(v, str):
            v.encode("utf-8")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(value)
    return value


def test_dumps_json_writes_null_for_non_finite_and_fffd_for_lone_surrogates():
    data = {"a": math.nan, "b": [math.inf, -math.inf, 1.5, {"c": "x\ud800y", "\udfff": 2}], "d": "\U0001f600"}
    out = strict(dumps_json(data, indent=1))
    assert out == {"a": None, "b": [None, None, 1.5, {"c": "x\ufffdy", "\ufffd": 2}], "d": "\U0001f600"}
    assert dumps_json({"a": 1.0}) == json.dumps({"a": 1.0})  # the fast path is plain json


def test_iter_json_is_dumps_json_in_pieces(monkeypatch):
    """--json is written in pieces (a long run's report is hundreds of MB): joined, the same text byte for byte,
    NaN, lone surrogates, non-string keys and lists longer than a batch at every level included."""
    import random

    monkeypatch.setattr(safe_io, "JSON_BATCH", 3)
    rnd = random.Random(40)

    def value(depth: int = 0) -> object:
        t = rnd.random()
        if depth > 4 or t < 0.3:
            return rnd.choice([1, 2.5, "x\u00e9\n", None, True, math.nan, "\ud800", [], {}, "\\ud", {1: 2}])
        if t < 0.65:
            return [value(depth + 1) for _ in range(rnd.randint(0, 9))]
        return {f"k{i}\"": value(depth + 1) for i in range(rnd.randint(0, 6))}

    pieces = 0
    for _ in range(2000):
        v = value()
        out = list(iter_json(v))
        assert "".join(out) == dumps_json(v, indent=2)
        pieces += len(out) > 1
    assert pieces > 500  # most were written in several pieces


def test_loads_json_reads_non_finite_as_null_and_keeps_surrogate_pairs():
    raw = b'{"a": NaN, "b": -Infinity, "c": 1e999, "d": "\\ud800", "e": "\\ud83d\\ude00", "f": 2.5}'
    assert loads_json(raw) == {"a": None, "b": None, "c": None, "d": "\ufffd", "e": "\U0001f600", "f": 2.5}
    assert math.isnan(loads_json(raw, finite=False)["a"])


def _live_run(tmp_path, health: dict) -> str:
    run = tmp_path / "run"
    (run / "live" / "node0").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"schema_version": 2, "mode": "run", "finished": False}))
    (run / "live" / "node0" / "health.json").write_text(json.dumps(health))
    return str(run)


@pytest.mark.parametrize("bad", ['"abc"', "[1]", '{"x": 1}', "NaN", "Infinity", "1e999", '"\\ud800"', "true"])
def test_status_of_a_live_run_with_a_bad_field_is_shown_not_a_traceback(tmp_path, bad):
    health = {"version": 1, "node": "node0", "updated": time.time(), "finished": False, "world_size": 2,
              "ranks_reporting": 1, "step": 5, "step_ms": 12.5, "steps_per_s": 80.0, "slowest_ranks": [0],
              "ranks": {"0": {"step": 5, "step_ms": 12.5, "busy_ms": 3.0, "phase_now": "forward",
                              "phase_share": {"forward": 0.5, "backward": 0.5}}},
              "alerts": [{"id": "stall", "title": "t", "step": 3, "time": 1.0}], "alerts_total": 1}
    run = _live_run(tmp_path, health)
    path = tmp_path / "run" / "live" / "node0" / "health.json"
    text = path.read_text()
    for field in ('"updated"', '"step"', '"step_ms"', '"world_size"', '"busy_ms"', '"forward"', '"alerts_total"'):
        text = text.replace(f"{field}: ", f"{field}: {bad}, \"was{field[1:]}: ", 1)
    path.write_text(text.replace('"slowest_ranks": [0]', f'"slowest_ranks": [{bad}]'))
    lock = runlock.acquire(tmp_path / "run")  # a live ddpdoctor holds its run
    try:
        procs = [run_cli("status", run), run_cli("status", "--json", run)]
    finally:
        lock.release()
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and not proc.stderr.strip(), proc.stderr
    strict(proc.stdout)


def test_analyze_json_of_a_run_with_nan_and_infinity_is_strict_json(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_RUN, run)
    status = run / "ranks" / "rank0" / "status.json"
    data = json.loads(status.read_text())
    data["duration_s"] = math.inf
    if isinstance(data.get("step_times_s"), list) and data["step_times_s"]:
        data["step_times_s"][-1] = math.nan
    status.write_text(json.dumps(data))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["duration_s"] = math.inf  # echoed in the report's "job"
    manifest["ddp_modules"]["0"][0]["bucket_cap_mb"] = math.nan  # echoed in "ddp"
    (run / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli("analyze", "--json", str(run))
    assert proc.returncode in (0, 1), proc.stderr
    strict(proc.stdout)


def test_an_integer_past_pythons_digit_limit_reads_as_null():
    # Issue 40 item 8: a 5,001-digit integer raised ValueError ("Exceeds the limit (4300 digits)") out of json.loads,
    # which the run-directory readers did not take for bad JSON: a traceback from analyze and diff.
    big = "9" * 5001
    assert loads_json(f'{{"exit_code": {big}, "ok": 7}}') == {"exit_code": None, "ok": 7}
    assert loads_json(f"[{big}]", finite=False) == [None]


def test_a_manifest_with_a_5001_digit_integer_is_no_traceback(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_RUN, run, ignore=shutil.ignore_patterns("scalars", "traces"))
    text = (run / "manifest.json").read_text()
    (run / "manifest.json").write_text(text.replace('"world_size": 2', '"world_size": ' + "9" * 5001, 1))
    for cmd in (["analyze", str(run)], ["status", "--json", str(run)], ["diff", str(run), str(SAMPLE_RUN)]):
        r = run_cli(*cmd)
        assert "Traceback" not in r.stderr and r.returncode in (0, 1, 2), (cmd, r.stderr[-500:])


@pytest.mark.parametrize("doc", [
    b'{"exception": "x\xed\xa0\x80"}',  # U+D800 as raw bytes: invalid UTF-8 json.loads decodes with surrogatepass
    b'{"exception": "x\xed\xb2\x80"}',  # U+DC80, what surrogateescape makes of a stray byte 0x80
    b'{"\xed\xbf\xbf": 1, "exception": "\\udc80"}',  # a raw one in a key, an escaped one in a value
    '{"exception": "x\udcff"}',  # a str read with errors="surrogateescape"
])
def test_a_lone_surrogate_in_raw_bytes_reads_as_fffd(doc, tmp_path):
    # Issue 40 item 8: only the escaped form ("\ud800") was replaced; the same surrogate written as bytes reached
    # the report as a str that cannot be encoded (a traceback wherever it is written or sent).
    from ddpdoctor.rundir.artefacts import decode_json

    value = loads_json(doc)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # raised UnicodeEncodeError before the fix
    assert "\ufffd" in json.dumps(value, ensure_ascii=False)
    if isinstance(doc, bytes):
        path = tmp_path / "status.json"
        path.write_bytes(doc)
        assert decode_json(path) == value


def test_a_manifest_with_raw_surrogate_bytes_is_one_line_under_a_strict_terminal(tmp_path):
    # Issue 40 item 8, the real shape: command_line written as a string holding ED A0 80. Under C.UTF-8 Python's
    # stdio escapes surrogates, which hid it; under en_US.UTF-8 (strict, as PYTHONIOENCODING emulates here) printing
    # the bad-input line raised UnicodeEncodeError: a traceback over analyze and diff.
    run = tmp_path / "run"
    shutil.copytree(SAMPLE_RUN, run, ignore=shutil.ignore_patterns("scalars", "traces"))
    doc = json.loads((run / "manifest.json").read_text())
    doc["command_line"] = "MARK"
    (run / "manifest.json").write_bytes(json.dumps(doc).replace('"MARK"', '"x\udced\udca0\udc80"')
                                        .encode("utf-8", "surrogateescape"))
    r = run_cli("analyze", str(run), env={"PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-500:]
    assert len(r.stderr.strip().splitlines()) == 1 and "manifest.json" in r.stderr, r.stderr


def test_a_lone_surrogate_reaches_the_terminal_as_a_visible_escape():
    # The writer side of issue 40 item 8: whatever reader let one through, a strict stdout never sees it.
    from ddpdoctor.terminal_text import one_line

    assert one_line("x\ud800y\udcff\x07") == "x\\ud800y\\udcff\\x07"
    one_line("x\ud800").encode("utf-8")

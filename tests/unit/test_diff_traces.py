"""`diff` of traces recorded elsewhere (no run directory): the bundled CPU sample and the real GPU traces of
../shared/traces, each against a copy whose clock is shifted by 5 s (another day's run of the same steps); and a world
size that differs is bad input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.commands.diff import command as diff_command
from tests.conftest import SAMPLE_RUN, shared_path

SHIFT_US = 5_000_000


def _shifted_copy(src: Path, dst: Path) -> Path:
    """Every trace file of ``src`` with every event's ts moved by SHIFT_US (a recording made later)."""
    dst.mkdir()
    for f in sorted(src.glob("*.json*")):
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt") as fh:
            data = json.load(fh)
        for ev in data.get("traceEvents", []):
            if isinstance(ev.get("ts"), (int, float)):
                ev["ts"] += SHIFT_US
        with opener(dst / f.name, "wt") as fh:
            json.dump(data, fh)
    return dst


def _diff(base: Path, new: Path) -> tuple[int, dict]:
    res = CliRunner().invoke(diff_command, [str(base), str(new), "--json", "--fail-on", "warning"])
    assert res.exit_code in (0, 1, 2), res.output
    return res.exit_code, json.loads(res.output) if res.exit_code != 2 else {"error": res.output}


def _check_shift_is_no_change(base: Path, tmp_path: Path) -> dict:
    code, report = _diff(base, _shifted_copy(base, tmp_path / "shifted"))
    assert code == 0 and report["findings"] == []
    d = report["diff"]
    assert d["step"]["delta_ms"]["value"] == pytest.approx(0.0, abs=1e-6)
    assert all(abs(c["delta_ms"]["value"]) < 1e-6 for c in d["components"])
    assert d["changes"] == []
    return d


def test_bundled_sample_traces_against_a_shifted_copy(tmp_path):
    d = _check_shift_is_no_change(SAMPLE_RUN / "traces", tmp_path)
    assert d["world_size"] == 2 and d["steps"] == {"base": 3, "new": 3}


def test_real_gpu_traces_against_a_shifted_copy(tmp_path):
    src = shared_path("traces", "sampled_2rank")  # skips when ../shared is absent
    d = _check_shift_is_no_change(src, tmp_path)
    assert d["world_size"] == 2
    assert any(c["op"] == "send_recv" for c in d["collectives"])


def test_different_world_sizes_are_bad_input(tmp_path):
    one_rank = tmp_path / "one"
    one_rank.mkdir()
    shutil.copy(sorted((SAMPLE_RUN / "traces").glob("rank0.*"))[0], one_rank)
    res = CliRunner().invoke(diff_command, [str(SAMPLE_RUN), str(one_rank)])
    assert res.exit_code == 2
    assert "different world sizes (base 2 rank(s), new 1)" in res.output and len(res.output.strip().splitlines()) == 1

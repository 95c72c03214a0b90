"""ddpdoctor profile on the bundled MLP: a real torchrun launch with 2 gloo ranks."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from tests.conftest import EXAMPLES, run_cli

pytestmark = pytest.mark.slow


def _profiler_steps(path):
    data = json.loads(gzip.open(path).read())
    return sorted(
        int(m.group(1)) for e in data["traceEvents"]
        if e.get("ph") == "X" and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", ""))))
    )


def test_profile_mlp_two_ranks(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "--out", str(out), str(EXAMPLES / "train_mlp.py"), "--epochs", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces = sorted((out / "traces").glob("rank*.pt.trace.json.gz"))
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"]
    for t in traces:
        assert _profiler_steps(t) == [3, 4, 5]  # wait 2, warmup 1, active 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["backend"] == "gloo" and manifest["exit_code"] == 0
    ddp = manifest["ddp_modules"]["0"][0]
    assert ddp["bucket_cap_mb"] == 25.0 and ddp["buckets_rebuilt"]
    assert sum(b["bytes"] for b in ddp["buckets"]) == ddp["parameter_bytes"]
    assert {p for b in ddp["buckets"] for p in b["params"]} == {p["name"] for p in ddp["parameters"]}
    for rank in (0, 1):
        assert (out / "ranks" / f"rank{rank}" / "stdout.log").exists()
        assert json.loads((out / "ranks" / f"rank{rank}" / "status.json").read_text())["exit_code"] == 0


def test_missing_script_is_bad_input(tmp_path):
    proc = run_cli("profile", "--nproc-per-node", "2", "--out", str(tmp_path / "r"), "no_such_script.py")
    assert proc.returncode == 2
    assert "no_such_script.py: script not found" in proc.stderr
    assert "Traceback" not in proc.stderr

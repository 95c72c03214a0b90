"""ddpdoctor profile: real torchrun launches with 2 gloo ranks of every bundled training loop."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import EXAMPLES, REPO, SCENARIOS, run_cli
from tests.ports import reserve_port
from tests.teardown import settle_run

pytestmark = pytest.mark.slow


def profiler_steps(path) -> list[int]:
    data = json.loads(gzip.open(path).read())
    return sorted(
        int(m.group(1)) for e in data["traceEvents"]
        if e.get("ph") == "X" and (m := re.match(r"^ProfilerStep#(\d+)$", str(e.get("name", ""))))
    )


def rank_traces(out):
    return sorted((out / "traces").glob("rank*.pt.trace.json.gz"))


@pytest.mark.parametrize("script,args", [
    ("train_mlp.py", ["--epochs", "1"]),
    ("train_transformer.py", ["--steps", "8"]),
    ("train_gradscaler.py", ["--steps", "8", "--skip-step", "4"]),   # the skipped step still ends iteration 4
    ("train_two_optimizers.py", ["--steps", "8"]),                    # two optimizer steps = one iteration
    ("train_manual_step.py", ["--steps", "8"]),                       # no optimizer: ddpdoctor.step()
    ("train_manual_step.py", ["--steps", "8", "--use-context"]),      # no optimizer: with ddpdoctor.iteration()
])
def test_profile_records_the_scheduled_steps(tmp_path, script, args):
    out = tmp_path / "run"
    # --run-to-completion: every iteration of the script is counted (by default ranks stop after the window).
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--active", "3", "--run-to-completion", "--out", str(out),
                   str(EXAMPLES / script), *args)
    settled = settle_run(proc, out)  # torch's teardown abort alone is forgiven (tests/teardown.py)
    # Performance findings (exposed gloo communication is common on 2 shared cores) do not fail a profile.
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    traces = rank_traces(out)
    assert [t.name.split(".")[0] for t in traces] == ["rank0", "rank1"]
    for t in traces:
        assert profiler_steps(t) == [3, 4, 5]  # wait 2, warmup 1 (defaults), active 3
    steps_per_run = 12 if script == "train_mlp.py" else 8
    for rank in (0, 1):
        status = json.loads((out / "ranks" / f"rank{rank}" / "status.json").read_text())
        assert status["exit_code"] == 0
        assert status["steps_completed"] == steps_per_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["backend"] == "gloo" and settled["job"]["exit_code"] == 0
    assert manifest["schedule"] == {"wait": 2, "warmup": 1, "active": 3, "repeat": 1, "auto": False, "min_active": 5}
    ddp = manifest["ddp_modules"]["0"][0]
    assert ddp["buckets"], "bucket layout missing"
    assert sum(b["bytes"] for b in ddp["buckets"]) == ddp["parameter_bytes"]
    assert sorted(p for b in ddp["buckets"] for p in b["params"]) == sorted(p["name"] for p in ddp["parameters"])


def test_manifest_describes_the_mlp_buckets(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--wait", "1", "--warmup", "0", "--active", "2",
                   "--out", str(out), str(EXAMPLES / "train_mlp.py"), "--bucket-cap-mb", "1")
    settle_run(proc, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for t in rank_traces(out):
        assert profiler_steps(t) == [1, 2]
    ddp = json.loads((out / "manifest.json").read_text())["ddp_modules"]["1"][0]
    assert ddp["bucket_cap_mb"] == 1.0 and ddp["buckets_rebuilt"]
    # 1 MB cap over 4.36 MB of float32 gradients: several buckets, last layer's grads first.
    assert len(ddp["buckets"]) >= 4
    assert ddp["buckets"][0]["params"][0] == "10.bias"


def test_crashing_rank_keeps_the_other_ranks_trace(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--out", str(out), str(SCENARIOS / "crash_rank1.py"))
    assert proc.returncode != 0
    assert [t.name.split(".")[0] for t in rank_traces(out)] == ["rank0", "rank1"]
    status1 = json.loads((out / "ranks" / "rank1" / "status.json").read_text())
    assert status1["exit_code"] == 1 and "boom: rank 1 failed on purpose" in status1["exception"]
    assert "crash_rank1.py" in status1["traceback"]
    # It crashed in iteration 4, inside the active window: step 3 and the partial step 4 are kept.
    assert profiler_steps(rank_traces(out)[1]) == [3, 4]


def test_script_without_ddp_is_profiled_and_said(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), str(SCENARIOS / "no_ddp.py"))
    settle_run(proc, out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert any(f["id"] == "no-ddp" for f in report["findings"])
    assert len(rank_traces(out)) == 2


def test_script_without_steps_is_one_clear_line(tmp_path):
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--out", str(tmp_path / "r"),
                   str(SCENARIOS / "no_optimizer_step.py"))
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert "no_optimizer_step.py: no training iteration was seen" in last and "ddpdoctor.step()" in last


@pytest.mark.parametrize("args,expect", [
    (["no_such_script.py"], "no_such_script.py: script not found"),
    (["--nproc-per-node", "zero", "examples/train_mlp.py"], "--nproc-per-node must be"),
    (["--active", "0", "examples/train_mlp.py"], "--active"),
    (["--out", "/proc/ddpdoctor-cannot-write", "examples/train_mlp.py"], "cannot write the run directory"),
    (["--no-python", "examples/train_mlp.py"], "--no-python is not supported"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, expect):
    if "--out" not in args:
        args = ["--out", str(tmp_path / "r"), *args]
    proc = run_cli("profile", *args)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_fail_on_gates_on_findings(tmp_path):
    """--fail-on error makes a profile exit 1 exactly when the report has an error finding (for CI gating)."""
    out = tmp_path / "run"
    proc = run_cli("profile", "--nproc-per-node", "2", "-q", "--json", "--fail-on", "warning", "--out", str(out),
                   str(EXAMPLES / "train_mlp.py"), "--bucket-cap-mb", "0.05")
    report = json.loads(proc.stdout)
    worst = {f["severity"] for f in report["findings"]}
    assert proc.returncode == (1 if worst & {"warning", "error"} else 0), (worst, proc.stderr[-2000:])


def test_existing_run_dir_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    first = run_cli("profile", "--nproc-per-node", "2", "-q", "--out", str(out), str(EXAMPLES / "train_mlp.py"))
    settle_run(first, out)
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_cli("profile", "--nproc-per-node", "2", "-q", "--out", str(out), str(EXAMPLES / "train_mlp.py"))
    assert again.returncode == 2 and "already holds a run" in again.stderr
    (out / "notes.txt").write_text("mine")
    third = run_cli("profile", "--nproc-per-node", "2", "-q", "--overwrite", "--out", str(out),
                    str(EXAMPLES / "train_mlp.py"))
    settle_run(third, out)
    assert third.returncode == 0, third.stderr[-2000:]
    assert len(rank_traces(out)) == 2  # the old traces are gone, not mixed with the new ones
    assert (out / "notes.txt").read_text() == "mine"


def test_launcher_none_reads_the_schedulers_environment(tmp_path):
    """What `srun ddpdoctor profile --launcher none` does: each task is one rank, from SLURM_* variables."""
    out = tmp_path / "run"
    procs = []
    port = reserve_port()  # one port for both ranks' store, reserved (tests/ports.py), not guessed
    for rank in (0, 1):
        env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(k, None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ddpdoctor", "profile", "--launcher", "none", "-q", "--run-to-completion", "--out", str(out),
             str(EXAMPLES / "train_mlp.py")], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert all(json.loads((out / "ranks" / f"rank{r}" / "status.json").read_text())["exit_code"] == 0 for r in (0, 1))
    assert [t.name.split(".")[0] for t in rank_traces(out)] == ["rank0", "rank1"]
    assert "epoch 0 loss" in (out / "ranks" / "rank0" / "stdout.log").read_text()
    assert json.loads((out / "ranks" / "rank1" / "info.json").read_text())["world_size"] == 2

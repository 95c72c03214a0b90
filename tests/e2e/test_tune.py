"""`ddpdoctor tune` for real: 2 gloo ranks, the baseline and a bucket_cap_mb variant interleaved (A B A: one round,
to keep the suite short; the order of more rounds is a unit test).

The suite's machine is noisy, so the tests assert the honesty rule (a winner only where intervals clear), never a
speed-up; and that the variant was in effect, from the bucket layout its ranks recorded."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.conftest import EXAMPLES, SCENARIOS, run_cli

# One worker runs the whole module (--dist loadgroup), so its module-scoped run is made once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="tune")]

# 64*256 + 2*256*256 + 256*10 weights, ~0.6 MB of gradients: one bucket at the default cap, several at 0.1 MB.
SCRIPT_ARGS = ["--steps-per-epoch", "12", "--width", "256", "--layers", "4"]
CAP = "0.1"


RESUME = """import atexit as _atexit
import pathlib as _pathlib

_CKPT = _pathlib.Path(__file__).with_name("ckpt.txt")
if __import__("os").environ.get("RANK") == "0":
    _START = int(_CKPT.read_text())
    with open(__import__("os").environ["STARTS_LOG"], "a") as _log:
        _log.write(f"{_START}\\n")
    _atexit.register(lambda: _CKPT.write_text(str(_START + 12)))
"""


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    script = tmp / "train.py"
    # A script that resumes from and saves a checkpoint beside itself (issue 40 item 5): every launch of the tune
    # (each trial included) must start from the user's state and leave it byte-identical.
    text = (EXAMPLES / "train_mlp.py").read_text()
    script.write_text(text.replace('\nimport argparse\n', '\nimport argparse\n' + RESUME, 1))
    (tmp / "ckpt.txt").write_text("100")
    before = _sha(script)
    run = tmp / "run"
    r = run_cli("tune", "--nproc-per-node", "2", "--out", str(run), "--no-auto", "--try", f"bucket_cap_mb={CAP}",
                "--rounds", "1", "--warmup", "3", "--steps", "6", "--json", str(script), *SCRIPT_ARGS, timeout=600,
                cwd=tmp, env={"STARTS_LOG": str(tmp.parent / f"{tmp.name}-starts.log")})
    return r, run, script, before


def test_variants_are_measured_with_intervals(tuned):
    r, run, _, _ = tuned
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["command"] == "tune"
    (v,) = data["variants"]
    assert v["setting"] == f"bucket_cap_mb={CAP}"
    for key in ("setting", "step_ms", "interval", "baseline", "winner", "predicted_ms"):
        assert key in v
    lo, hi = v["interval"]
    assert lo <= v["step_ms"] <= hi and v["n"] == 6  # 6 measured iterations of its launch
    assert v["baseline"]["interval"] and data["tune"]["baseline"]["n"] == 12  # 2 baseline launches
    blo, bhi = v["baseline"]["interval"]
    assert blo <= v["baseline"]["step_ms"] <= bhi
    assert isinstance(v["predicted_ms"], float)  # the what-if's prediction for this cap
    # A B A: the variant's launch between two baseline launches.
    assert data["tune"]["design"]["order"] == ["baseline", v["setting"], "baseline"]
    assert len(list((run / "trials").iterdir())) == 3


def test_no_winner_is_claimed_inside_the_noise(tuned):
    data = json.loads(tuned[0].stdout)
    for v in data["variants"]:
        clears = v["interval"][1] < v["baseline"]["interval"][0] and v["diff_interval"][1] < 0
        assert v["winner"] == (v["verdict"] == "faster")
        if v["winner"]:
            assert clears, v
        if not clears:
            assert not v["winner"], v
    ids = {f["id"] for f in data["findings"]}
    assert ("tune-winner" in ids) == any(v["winner"] for v in data["variants"])


def test_the_users_script_is_untouched(tuned):
    _, _, script, before = tuned
    assert _sha(script) == before
    # The checkpoint it resumes from and saves is as the user left it, and nothing else was left in its folder.
    assert (script.parent / "ckpt.txt").read_text() == "100"
    assert sorted(p.name for p in script.parent.iterdir()) == ["ckpt.txt", "run", "train.py"]
    starts = (script.parent.parent / f"{script.parent.name}-starts.log").read_text().split()
    assert starts == ["100"] * 4  # the profiled launch and the three trials (A B A) each started from step 100
    data = json.loads(tuned[0].stdout)
    assert data["tune"]["script"]["unchanged"] is True


def test_the_tuned_setting_was_in_effect_in_the_recorded_bucket_layout(tuned):
    _, run, _, _ = tuned
    data = json.loads(tuned[0].stdout)
    (v,) = data["variants"]
    layouts = {}
    for trial in sorted((run / "trials").iterdir()):
        info = json.loads((trial / "ranks" / "rank0" / "info.json").read_text())
        (module,) = info["ddp_modules"]
        layouts.setdefault(trial.name.split("-", 1)[1], []).append(module)
    for m in layouts[f"bucket_cap_mb={CAP}"]:
        assert m["bucket_cap_mb"] == float(CAP) and m["buckets_rebuilt"]
        assert len(m["buckets"]) == v["buckets"] > 1
    for m in layouts["baseline"]:
        assert m["bucket_cap_mb"] == 25.0 and len(m["buckets"]) == v["baseline_buckets"] == 1
    assert v["in_effect"] is True
    assert v["buckets"] == v["expected_buckets"]  # DDP built what the what-if's replay of this cap predicts
    assert v["numerics"]["state"] == "identical"  # another bucket layout, the same sums on gloo


def test_html_and_tensorboard_views(tuned):
    _, run, _, _ = tuned
    page = (run / "report.html").read_text()
    assert 'id="tune"' in page and f"bucket_cap_mb={CAP}" in page
    assert (run / "scalars" / "tune-baseline").is_dir() and any((run / "scalars").glob("tune-bucket_cap_mb=*"))
    # The TensorBoard tab lists the run directory and serves the same page.
    from ddpdoctor.renderers.html import render_html
    from ddpdoctor.tensorboard_plugin import runs

    found = runs.find_runs(run.parent)
    assert found.get("run") == run and runs.run_summary("run", run)["command"] == "tune"
    assert 'id="tune"' in render_html(runs.load_report(run))


def test_a_script_that_never_builds_ddp_gets_one_clear_line(tmp_path):
    r = run_cli("tune", "--nproc-per-node", "2", "--out", str(tmp_path / "run"), "--no-auto", "--try",
                "bucket_cap_mb=1", str(SCENARIOS / "no_ddp.py"), timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ddpdoctor: error:")]
    assert len(lines) == 1 and "never built" in lines[0] and "no_ddp.py" in lines[0]


def test_bad_try_is_bad_input_before_anything_runs(tmp_path):
    r = run_cli("tune", "--out", str(tmp_path / "run"), "--try", "bucket_cap_mb=lots", str(SCENARIOS / "healthy.py"))
    assert r.returncode == 2 and "--try" in r.stderr and not (tmp_path / "run").exists()

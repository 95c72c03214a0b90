"""FSDP2 and HSDP jobs get the same doctor (issue 37): real gloo launches of tests/scenarios/fsdp_train.py, FSDP2 on
2 ranks and HSDP on 4 (a 2x2 mesh).

Launches are shared, the suite's time being the budget: one `tune` of the plain FSDP2 script (no prefetch) serves
the profile tests through its own profiled launch (RUN/profile, a normal profile run directory, read back with
`analyze`) and measures forward prefetch against it; one `profile --run-to-completion` of the script with explicit
prefetch whose rank 1 then freezes a unit serves both the prefetched report and the hang where the ranks parted;
one 4-rank HSDP `check-sync` serves the HSDP record, the replica comparison and the healthy buffer and optimizer
step-count comparisons; one 2-rank `check-sync` with a changed buffer and a skipped step; one TP `check-sync`.
Seven launches in all (tune's four among them)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SCENARIOS, run_cli
from tests.teardown import settle_cli

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(name="fsdp")]

SCRIPT = str(SCENARIOS / "fsdp_train.py")
# Rules that read DDP's buckets or options: none may fire on a job without DDP.
DDP_ONLY = {"no-ddp", "buckets-latency-bound", "first-bucket-late", "find-unused-parameters-unneeded",
            "static-graph-would-help", "find-unused-parameters-on", "gradient-as-bucket-view-off"}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """`tune` of the FSDP2 script without prefetch, forward prefetch one unit deep as the only variant: its profiled
    launch and three trials (A B A). The script is a copy in its own folder (tune guards the script's folder)."""
    tmp = tmp_path_factory.mktemp("fsdp_tune")
    script = tmp / "fsdp_train.py"
    script.write_text((SCENARIOS / "fsdp_train.py").read_text())
    out = tmp / "run"
    args = ("tune", "--nproc-per-node", "2", "--json", "--out", str(out), "--no-auto", "--try", "forward_prefetch=1",
            "--rounds", "1", "--warmup", "3", "--steps", "4")
    proc = run_cli(*args, str(script), "--steps", "10", timeout=600, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def fsdp_run(tuned):
    """The tune's profiled launch of the script's own settings, analysed as `analyze` does."""
    out = tuned[0] / "profile"
    args = ("analyze", "--json", "--fail-on", "error", str(out))
    proc = run_cli(*args, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def _info(out, rank: int) -> dict:
    return json.loads((out / "ranks" / f"rank{rank}" / "info.json").read_text())


def test_fsdp2_units_and_mesh_are_recorded(fsdp_run):
    out, report = fsdp_run
    for rank in (0, 1):
        p = _info(out, rank)["parallelism"]
        assert p["kinds"] == ["fsdp2"] and p["ddp_modules"] == 0
        assert p["meshes"] == [{"device_type": "cpu", "dim_names": ["dp"], "shape": [2], "ranks": [0, 1]}]
        units = p["fsdp2_units"]
        # fully_shard on each Linear (the root owns no parameter of its own, so it is no unit)
        assert [u["fqn"] for u in units] == ["0", "2", "4", "6"]
        assert all(u["kind"] == "fsdp" and u["shard_dim"] == "dp" and u["replicate_dim"] is None for u in units)
        # Linear(256, 256): 256*256 + 256 float32 = 263,168 bytes, half of it on each of 2 ranks
        assert units[0]["numel"] == 65_792 and units[0]["bytes"] == 263_168 and units[0]["sharded_bytes"] == 131_584
        assert units[0]["param_names"] == ["0.weight", "0.bias"]
        assert units[0]["reshard_after_forward"] is True and units[0]["forward_prefetch"] == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parallelism"]["kinds"] == ["fsdp2"] and manifest["parallelism_differs"] == []


def test_fsdp2_report_says_what_it_saw_and_no_ddp_rule_fires(fsdp_run):
    _, report = fsdp_run
    ids = {f["id"] for f in report["findings"]}
    assert not ids & DDP_ONLY, ids
    f = next(f for f in report["findings"] if f["id"] == "parallelism")
    assert f["title"].startswith("The job built FSDP2: 4 fully_shard unit(s)") and "(dp=2)" in f["title"]
    assert f["evidence"]["fsdp2_units"] == 4


def _check_sync(tmp_path_factory, name: str, nproc: int, *script_args: str) -> tuple[object, dict, int]:
    out = tmp_path_factory.mktemp(name)
    args = ("check-sync", "--nproc-per-node", str(nproc), "--json", "--out", str(out))
    proc = run_cli(*args, SCRIPT, *script_args, timeout=400)
    report = settle_cli(proc, json.loads(proc.stdout), args)
    return out, report, proc.returncode


def test_check_sync_names_a_replicated_dtensor_weight_and_its_mesh_dim(tmp_path_factory):
    # TP on a 1-D "tp" mesh of 2 ranks; rank 1 scales its copy of the Replicate()d LayerNorm weight after step 0.
    _, report, code = _check_sync(tmp_path_factory, "tp_drift", 2, "--mesh", "tp", "--bug", "drift", "--steps", "8")
    assert code == 1, report
    f = next(f for f in report["findings"] if f["id"] == "param-divergence")
    assert f["severity"] == "error" and f["ranks"] == [1] and f["evidence"]["step"] == 1
    assert "3.weight" in f["evidence"]["parameters"] and f["evidence"]["mesh_dims"] == ["tp"]
    assert "mesh dim 'tp'" in f["title"] and "no DistributedDataParallel" not in f["title"]
    # the column- and row-sharded weights are never compared by value, only by layout
    assert not any(p in f["evidence"]["parameters"] for p in ("0.weight", "2.weight"))
    checks = report["checks"]
    assert checks["layouts"] == {"comparisons": 6, "differ": 0}
    # both TP ranks read the same batches (one data-parallel rank): no sampler finding, and the report says why
    assert not any(f["id"].startswith("sampler-") for f in report["findings"]), report["findings"]
    assert any("per data-parallel group" in n and "[0, 1]" in n for n in report["notes"]), report["notes"]


@pytest.fixture(scope="module")
def hsdp_sync(tmp_path_factory):
    return _check_sync(tmp_path_factory, "hsdp_sync", 4, "--mesh", "hsdp", "--steps", "4")


def test_hsdp_on_a_2x2_mesh(hsdp_sync):
    out, report, _ = hsdp_sync
    for rank in range(4):
        p = _info(out, rank)["parallelism"]
        assert p["kinds"] == ["hsdp"]
        assert p["meshes"][0]["dim_names"] == ["replicate", "shard"] and p["meshes"][0]["shape"] == [2, 2]
        assert p["meshes"][0]["ranks"] == [0, 1, 2, 3]
        u = p["fsdp2_units"][0]
        assert (u["kind"], u["shard_dim"], u["replicate_dim"]) == ("hsdp", "shard", "replicate")
        assert u["sharded_bytes"] * 2 == u["bytes"]  # sharded over the 2 ranks of 'shard' only
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parallelism"]["kinds"] == ["hsdp"] and manifest["parallelism_differs"] == []
    assert not {f["id"] for f in report["findings"]} & DDP_ONLY


def test_check_sync_hsdp_compares_replicas_over_the_replicate_dim(hsdp_sync):
    _, report, code = hsdp_sync
    assert code == 0, report
    assert report["status"] == "ok"
    checks = report["checks"]
    # 8 parameters x 2 replica pairs ((0,2) and (1,3) over 'replicate') x the checked steps; every rank's layout
    # of the 8 against rank 0's
    assert checks["steps_checked"] >= 2
    assert checks["params"]["comparisons"] == 8 * 2 * checks["steps_checked"] and checks["params"]["diverged"] == 0
    assert checks["layouts"] == {"comparisons": 24, "differ": 0}
    # the buffer (7.scale, a plain tensor fully_shard leaves alone) and AdamW's two step counts, across all 4 ranks
    n = checks["steps_checked"]
    assert checks["buffers"]["comparisons"] == 1 * 3 * n and checks["buffers"]["diverged"] == 0
    assert checks["optimizer_steps"]["comparisons"] == 2 * 3 * n and checks["optimizer_steps"]["diverged"] == 0
    assert any(f"{3 * n} buffer, {6 * n} optimizer step-count" in x for x in report["notes"]), report["notes"]
    assert not {f["id"] for f in report["findings"]} & {"param-divergence", "nothing-compared", "no-ddp",
                                                        "buffer-divergence", "optimizer-steps-differ", "divergence"}


def test_check_sync_fsdp2_names_a_changed_buffer_and_a_skipped_optimizer_step(tmp_path_factory):
    # 1-D FSDP2 shards every parameter, so no value has a peer: the buffer and the optimizer's step count are what
    # must agree. Rank 1 scales its buffer after step 0 and skips optimizer.step() at step 2.
    _, report, code = _check_sync(tmp_path_factory, "fsdp_bugs", 2, "--bug", "buffer", "--bug", "skip-step",
                                  "--steps", "6")
    assert code == 1, report
    ids = {f["id"]: f for f in report["findings"]}
    buf = ids["buffer-divergence"]
    assert buf["severity"] == "error" and buf["ranks"] == [1] and buf["evidence"]["step"] == 1
    assert buf["evidence"]["buffers"] == ["7.scale"] and buf["evidence"]["ddp"] is False
    opt = ids["optimizer-steps-differ"]
    assert opt["severity"] == "error" and opt["ranks"] == [1] and opt["evidence"]["step"] == 2
    assert opt["evidence"]["step_calls"] == {"0": 3, "1": 2}
    assert opt["evidence"]["state_step_min_max"] == {"0": [3.0, 3.0], "1": [2.0, 2.0]}
    checks = report["checks"]
    # the iterations are counted in FSDP2's root forwards: the rank that skipped a step stopped with its peers
    assert checks["steps_run"] == checks["steps_checked"] == 5
    assert checks["optimizer_steps"]["first_step"] == 2 and checks["params"]["comparisons"] == 0
    assert not any("ended after" in n for n in report["notes"]), report["notes"]


@pytest.fixture(scope="module")
def prefetch_run(tmp_path_factory):
    """FSDP2 with explicit prefetch, profiled (steps 3-5; --run-to-completion keeps training after the window), whose
    rank 1 freezes unit '0' at step 8: FSDP2 skips that unit's reduce-scatter there, the ranks part (ezpz#242's
    shape) and the job hangs. One launch: the report holds the prefetched profile and the hang."""
    out = tmp_path_factory.mktemp("fsdp_prefetch_parted")
    args = ("profile", "--nproc-per-node", "2", "-q", "--json", "--out", str(out), "--active", "3",
            "--run-to-completion", "--hang-timeout", "8")
    proc = run_cli(*args, SCRIPT, "--prefetch", "--bug", "freeze-unit", "--freeze-at", "8", "--steps", "12",
                   timeout=400)
    report = settle_cli(proc, json.loads(proc.stdout), args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    return out, report


def test_overlap_is_not_counted_from_fsdp_ranges(fsdp_run):
    # FSDP2 on CPU issues its all-gathers synchronously: the main thread waits, so most of the communication is
    # exposed. Counting FSDP's own ranges as compute said 100% overlap and 0 ms exposed (issue 37).
    _, report = fsdp_run
    for r in report["ranks"]:
        assert r["overlap_pct"] < 50.0 and r["exposed_comm_us"] > 0.25 * r["comm_us"], r


def test_unit_inventory_names_every_unit_with_its_collectives(fsdp_run):
    _, report = fsdp_run
    units = report["fsdp_units"]["units"]
    assert [u["unit"] for u in units] == ["0", "2", "4", "6"]
    for u in units:
        assert u["all_gather_forward_ms"] > 0 and u["reduce_scatter_ms"] > 0 and u["params"] > 0
        assert u["forward_prefetched"] is False
        # the late peer's part of the exposed time, and who (docs/metrics.md "Late peer"); a timing, so only its shape
        assert 0 <= u["late_peer_exposed_ms"] and u["late_rank"] in (None, 0, 1)
    assert units[0]["first"] is True and not any(u["first"] for u in units[1:])
    # the last unit's backward all-gather is its own; the others' are prefetched by FSDP2 one unit deep
    assert all(u["all_gather_backward_ms"] > 0 for u in units)


def test_no_prefetch_is_found_without_prefetch_and_not_with_it(fsdp_run, prefetch_run):
    _, plain = fsdp_run
    _, prefetched = prefetch_run
    f = next(f for f in plain["findings"] if f["id"] == "fsdp-no-prefetch")
    # every unit but the first (whose all-gather is unavoidable, and said so) is named
    assert set(f["evidence"]["units"]) == {"2", "4", "6"} and f["evidence"]["first_unit"] == "0"
    assert "set_modules_to_forward_prefetch" in f["advice"]
    # on CPU/gloo the main thread waits out every all-gather: no gain is predicted, and the report says why
    assert "async_op=False" in f["evidence"]["prediction"] and "predicted_saved_ms_per_step" not in f["evidence"]
    assert plain["fsdp_units"]["prefetch_replay"]["predictable"] is False
    assert "fsdp-no-prefetch" not in {f["id"] for f in prefetched["findings"]}
    units = prefetched["fsdp_units"]["units"]
    assert [u["forward_prefetched"] for u in units] == [False, True, True, True]
    assert not {f["id"] for f in prefetched["findings"]} & DDP_ONLY


def test_tune_measures_forward_prefetch_against_the_scripts_own_fsdp2(tuned):
    out, data = tuned
    assert data["command"] == "tune"
    t = data["tune"]
    # the design is DDP's: the variant's launch between two baseline launches, 4 measured iterations each
    assert t["design"]["order"] == ["baseline", "forward_prefetch=1", "baseline"]
    assert len(list((out / "trials").iterdir())) == 3
    assert t["baseline"]["options"] == {"units": 4, "forward_prefetch": 0, "backward_prefetch": 0,
                                        "reshard_after_forward": ["True"]}
    (v,) = data["variants"]
    assert v["setting"] == "forward_prefetch=1" and v["n"] == 4 and t["baseline"]["n"] == 8
    lo, hi = v["interval"]
    assert lo <= v["step_ms"] <= hi
    assert v["winner"] == (v["verdict"] == "faster")
    assert "set_modules_to_forward_prefetch(units[i + 1:i + 1 + 1])" in v["change"]
    # the setting was in effect: the variant's ranks recorded each unit prefetching the next one, the baseline's none
    for trial in sorted((out / "trials").iterdir()):
        units = [u for u in _info(trial, 0)["parallelism"]["fsdp2_units"] if not u["is_root"]]
        want = [["2"], ["4"], ["6"], []] if "prefetch" in trial.name else [[], [], [], []]
        assert [u["forward_prefetch"] for u in units] == want, trial.name
    assert data["tune"]["script"]["unchanged"] is True


def test_run_names_the_rank_that_took_another_path_through_the_units_and_where(prefetch_run):
    # saforem2/ezpz#242's shape: rank 1 froze unit '0' at step 8, so FSDP2 skipped that unit's reduce-scatter there
    # and went on to step 9; rank 0 waits in the reduce-scatter. A hang (on gloo too: the collectives' sizes never
    # meet gloo's size check), its culprit and the unit where the ranks parted.
    _, report = prefetch_run
    hang = next(f for f in report["findings"] if f["id"] == "hang")
    assert hang["ranks"] == [1] and hang["evidence"]["culprit_ranks"] == [1]
    assert hang["evidence"]["collective"]["unit"] == "FSDP unit '0' (Linear), reduce-scatter on mesh dim 'dp'"
    assert "the ranks parted at FSDP unit '0' (Linear), reduce-scatter on mesh dim 'dp' (step 8, backward" in hang["title"]
    assert "went on to FSDP unit '0' (Linear), forward all-gather on mesh dim 'dp' (step 9, forward" in hang["title"]
    assert "fully_shard units" in hang["advice"] and not {f["id"] for f in report["findings"]} & DDP_ONLY
    # The per-step fingerprint names it first (issue 38): both ranks sent that step's grad-set event at the start of
    # its backward (the fingerprint counts steps from 1: the script's step 8 is its step 9), and the hang points to it.
    div = next(f for f in report["findings"] if f["id"] == "divergence")
    assert div["ranks"] == [1] and div["evidence"]["step"] == 9, div
    assert div["evidence"]["items"][0]["field"] == "grads" and "it stopped building 0.weight, 0.bias" in div["title"]
    assert "diverged at step 9 before: see the divergence finding" in hang["title"]

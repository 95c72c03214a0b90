"""ddpdoctor under the frameworks that hide DDP (issue 27): a Lightning Trainer, an accelerate loop and an HF
Trainer (a tiny model built from a config) on CPU/gloo in the spirit of their own examples, and any script whose
optimizer steps with a closure. Real launches, 2 ranks, few steps; each framework's test skips when it is not
installed (the `frameworks` extra)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.conftest import SCENARIOS, run_cli

pytestmark = pytest.mark.slow


def _check_sync(tmp_path, name: str, *args: str) -> tuple[int, dict]:
    proc = run_cli("check-sync", "--nproc-per-node", "2", "-q", "--json", "--out", str(tmp_path / name), *args)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_gradients_are_compared_when_the_optimizer_steps_with_a_closure(tmp_path) -> None:
    code, report = _check_sync(tmp_path, "ok", str(SCENARIOS / "closure_step.py"))
    assert code == 0, report
    assert report["checks"]["grads"]["comparisons"] > 0 and report["checks"]["grads"]["diverged"] == 0
    # A rank whose gradients differ after DDP's reduction inside the closure is caught there, at its first step.
    code, report = _check_sync(tmp_path, "skew", str(SCENARIOS / "closure_step.py"), "--skew-rank", "1")
    assert code == 1
    assert report["checks"]["grads"]["diverged"] > 0 and report["checks"]["grads"]["first_step"] == 0


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning not installed (extra: frameworks)")
def test_lightning_trainer_runs_under_check_sync_and_its_gradients_are_compared(tmp_path) -> None:
    # Before: the sampler probe's DataLoader.__init__ had another signature, and Lightning (re-creating the loader
    # to add its DistributedSampler) failed with "missing attributes ['loader']"; and no gradient was compared.
    code, report = _check_sync(tmp_path, "pl", str(SCENARIOS / "lightning_ddp.py"), "--steps", "8")
    assert code == 0, report
    assert [f["id"] for f in report["findings"] if f["severity"] in ("warning", "error")] == []
    assert report["checks"]["grads"]["comparisons"] > 0 and report["checks"]["grads"]["diverged"] == 0
    (loader,) = report["checks"]["data"]
    assert loader["samples_per_rank"] == {"0": 256, "1": 256} and loader["shared"] == 0


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate not installed (extra: frameworks)")
def test_accelerate_per_rank_seed_is_a_different_shuffle_order_not_a_missing_sampler(tmp_path) -> None:
    # Before: "no DistributedSampler: every rank reads the whole dataset", while the table showed half per rank.
    code, report = _check_sync(tmp_path, "bug", str(SCENARIOS / "accelerate_seed.py"), "--seed-per-rank")
    assert code == 1
    (loader,) = report["checks"]["data"]
    assert loader["samples_per_rank"] == {"0": 128, "1": 128} and loader["shared"] > 0
    overlap = next(f for f in report["findings"] if f["id"] == "sampler-overlap")
    assert overlap["evidence"]["cause"] == "shard-order-differs"
    assert "own order" in overlap["title"] and "whole dataset" not in overlap["title"].split(":")[0]
    assert "set_seed(seed)" in overlap["advice"] and "prepare" in overlap["advice"]
    code, report = _check_sync(tmp_path, "ok", str(SCENARIOS / "accelerate_seed.py"))
    assert code == 0 and report["checks"]["data"][0]["shared"] == 0, report


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate not installed (extra: frameworks)")
def test_accelerate_loader_left_out_of_prepare_is_advised_in_accelerates_terms(tmp_path) -> None:
    # Before (issue 39): "no DistributedSampler: every rank reads the whole dataset", advising a DistributedSampler
    # to a script whose fix is accelerator.prepare(loader).
    code, report = _check_sync(tmp_path, "unprepared", str(SCENARIOS / "accelerate_seed.py"), "--no-prepare-loader")
    assert code == 1
    overlap = next(f for f in report["findings"] if f["id"] == "sampler-overlap")
    assert overlap["evidence"]["cause"] == "accelerate-not-prepared"
    assert "accelerator.prepare(" in overlap["advice"] and "sampler=DistributedSampler" not in overlap["advice"]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers not installed (extra: frameworks)")
def test_hf_trainer_advice_is_in_training_arguments_terms(tmp_path) -> None:
    # The HF Trainer builds DDP with find_unused_parameters=True; the user sets it through TrainingArguments.
    proc = run_cli("profile", "--nproc-per-node", "2", "--json", "--out", str(tmp_path / "hf"),
                   str(SCENARIOS / "hf_trainer.py"), "--steps", "30")
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    (flag,) = [f for f in report["findings"] if f["id"] == "find-unused-parameters-unneeded"]
    assert flag["advice"].startswith("`TrainingArguments(ddp_find_unused_parameters=False)`"), flag["advice"]
    # Every DDP-option advice of the run (the bucket findings' bucket_cap_mb or compression hook included) is said in
    # the HF Trainer's terms: never "DDP(model, ...)", which the user cannot write under the Trainer.
    for f in report["findings"]:
        assert "`DDP(model, " not in (f.get("advice") or ""), (f["id"], f["advice"])
    info = json.loads(next((tmp_path / "hf" / "ranks").glob("rank0/info.json")).read_text())
    assert info["ddp_modules"][0]["built_by"] == "transformers"


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning not installed (extra: frameworks)")
def test_lightning_without_its_sampler_is_advised_in_lightnings_terms(tmp_path) -> None:
    code, report = _check_sync(tmp_path, "nosampler", str(SCENARIOS / "lightning_ddp.py"), "--steps", "8",
                               "--no-lightning-sampler")
    assert code == 1
    overlap = next(f for f in report["findings"] if f["id"] == "sampler-overlap")
    assert overlap["evidence"]["cause"] == "lightning-sampler-off"
    assert "use_distributed_sampler" in overlap["advice"]


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="Lightning not installed (extra: frameworks)")
def test_lightning_unused_layer_is_named_and_advised_in_lightnings_terms(tmp_path) -> None:
    # Lightning 2.x replaces DDP's "Expected to have finished reduction ..." by its own message, without the
    # parameter list: it was explained as "fix the exception in this rank's traceback", in `run` and in `logs`.
    out = tmp_path / "unused"
    proc = run_cli("run", "--nproc-per-node", "2", "-q", "--json", "--out", str(out),
                   str(SCENARIOS / "lightning_ddp.py"), "--steps", "8", "--unused-layer")
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == 1
    (unused,) = [f for f in report["findings"] if f["id"] == "unused-parameters"]
    assert unused["severity"] == "error"
    assert "`Trainer(strategy=DDPStrategy(find_unused_parameters=True))`" in unused["advice"]
    assert "check-sync" in unused["advice"] and "DistributedDataParallel" not in unused["advice"]
    # the same from the ranks' logs alone (the traceback passes through Lightning's files)
    logs = run_cli("logs", "--json", *(str(p) for p in sorted(out.glob("ranks/rank*/stderr.log"))))
    (from_logs,) = [f for f in json.loads(logs.stdout)["findings"] if f["id"] == "unused-parameters"]
    assert "`Trainer(strategy=DDPStrategy(find_unused_parameters=True))`" in from_logs["advice"]

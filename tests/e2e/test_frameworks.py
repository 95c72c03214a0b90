"""check-sync under the frameworks that hide DDP (issue 27): a Lightning Trainer on CPU/gloo in the spirit of
Lightning's examples, and any script whose optimizer steps with a closure. Real launches, 2 ranks, few steps;
the Lightning test skips when Lightning is not installed (the `frameworks` extra)."""

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

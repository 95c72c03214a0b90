"""`ddpdoctor tune`'s probe on a real (one-rank, gloo) DDP: the variant is bound onto the script's own constructor
call, keyword or positional; a hook is registered; losses are recorded; the trial ends at the asked iteration."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddpdoctor.probes.profiler import ProfileWindowDone
from ddpdoctor.probes.steps import StepTracker
from ddpdoctor.probes.tune import TuneProbe


@pytest.fixture
def group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _probe(tmp_path, setting, stop_after=100):
    tracker = StepTracker()
    tracker.install()
    probe = TuneProbe(setting, stop_after, tracker, tmp_path / "tune.json")
    probe.install()
    tracker.add_listener(probe.on_step)
    return tracker, probe


def test_options_replace_the_scripts_own_keyword_and_positional_values(group, tmp_path):
    tracker, probe = _probe(tmp_path, {"bucket_cap_mb": 1.0, "gradient_as_bucket_view": True})
    try:
        by_keyword = DDP(nn.Linear(4, 2), bucket_cap_mb=25)
        # DDP(module, device_ids, output_device, dim, broadcast_buffers, init_sync, process_group, bucket_cap_mb)
        by_position = DDP(nn.Linear(4, 2), None, None, 0, True, True, None, 25)
    finally:
        probe.uninstall()
        tracker.uninstall()
    for m in (by_keyword, by_position):
        assert m.bucket_bytes_cap == 1 << 20 and m.gradient_as_bucket_view is True
    assert probe.applied[0]["given"] == {"bucket_cap_mb": 25} and probe.applied[1]["given"] == {"bucket_cap_mb": 25}
    assert DDP(nn.Linear(4, 2)).bucket_bytes_cap == 25 << 20  # uninstalled: the script's own again


def test_hook_losses_and_the_trial_end(group, tmp_path):
    tracker, probe = _probe(tmp_path, {"comm_hook": "fp16"}, stop_after=3)
    try:
        torch.manual_seed(0)
        model = DDP(nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ProfileWindowDone):
            for _ in range(10):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        assert tracker.step == 3
    finally:
        probe.uninstall()
        tracker.uninstall()
    data = json.loads((tmp_path / "tune.json").read_text())
    assert data["applied"][0]["comm_hook"] == "fp16" and data["errors"] == []
    assert len(data["loss_per_iteration"]) == 3 and all(isinstance(x, float) for x in data["loss_per_iteration"])


def test_a_hook_the_backend_refuses_is_recorded_not_raised(group, tmp_path):
    tracker, probe = _probe(tmp_path, {"comm_hook": "bf16"})
    try:
        DDP(nn.Linear(4, 2))  # torch refuses bf16 compression on gloo
    finally:
        probe.uninstall()
        tracker.uninstall()
    assert probe.applied[0]["comm_hook"] is None and "bf16" in probe.errors[0]

"""The bucket what-if on a real A100 NCCL trace (../shared, rank 0 of a 2-GPU DDP ResNet; no shapes recorded)."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses.whatif import bucket_whatif
from tests.conftest import shared_path

pytestmark = pytest.mark.shared


def test_whatif_replays_the_recorded_layout_on_a_real_gpu_trace():
    path = shared_path("traces", "a100_ddp_resnet_rank0")
    try:
        from ddpdoctor.analyses.pipeline import analyze_paths
    except ImportError:
        pytest.skip("needs the analyze pipeline")
    w = bucket_whatif(analyze_paths([path]))
    # 161 gradients per step without shapes: sizes come from the 5 measured buckets, so replaying the
    # current layout must give back 5 buckets per step.
    assert w.available and w.grad_source == "trace+bucket_sizes"
    assert w.measured_buckets_per_step == 5 and w.current_buckets_per_step == 5
    assert [p.bucket_cap_mb for p in w.predictions] == [1, 5, 10, 25, 50, 100, 200]
    counts = [p.buckets_per_step for p in w.predictions]
    assert counts == sorted(counts, reverse=True) and counts[0] > 5 > counts[-1]
    assert w.saving_us_per_step is not None and w.saving_us_per_step >= 0

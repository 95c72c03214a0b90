"""check-sync's probe counts the job's iterations in DDP's own all-reduces, so its stop agreement (a collective on
its own group) lines up with the job's collectives on every rank, even on a rank that skips optimizer.step()
(benchmarks/faults diverge-skip-step-4r: before, the peers entered the agreement while that rank waited in DDP's
all-reduce, and the job hung). One in-process gloo group of one rank, a real DDP module, the real step tracker."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("skip", [1, 2])
def test_a_skipped_optimizer_step_does_not_move_the_stop_agreement(tmp_path, skip) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.probes.steps import StepTracker
    from ddpdoctor.probes.sync import CheckSyncStop, install_check_sync
    from ddpdoctor.rundir.layout import RunDir

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tracker = StepTracker()
    tracker.install()
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    probe = install_check_sync(RunDir(tmp_path), 0, 2, {"steps": 3}, tracker)
    agreed: list[tuple[int, int]] = []  # (DDP all-reduces so far, optimizer steps so far) at each agreement
    probe._agree = lambda needed: agreed.append((forwards[0], tracker.step)) or 0  # type: ignore[method-assign]
    forwards = [0]
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(CheckSyncStop) as stop:
            for it in range(10):
                opt.zero_grad()
                out = model(torch.randn(3, 4))  # the stop may come here: before this iteration's all-reduce
                out.sum().backward()
                forwards[0] += 1
                if it != skip:  # this rank skips one optimizer step (a rank-local decision)
                    opt.step()
        # Every rank agrees after the job's third all-reduce, whichever optimizer steps it skipped; the rank
        # that skipped the last one agrees before its next forward, never inside DDP's all-reduce.
        assert agreed == [(3, 2)]
        assert stop.value.step == 3
        rows = probe.record()
        assert sorted({r["step"] for r in rows["params"]}) == [s for s in range(3) if s != skip]
    finally:
        probe.uninstall()
        tracker.uninstall()
        dist.destroy_process_group()


def test_a_nan_loss_on_one_rank_is_an_error_naming_that_rank(tmp_path) -> None:
    """DDP all-reduces one rank's NaN gradient into every rank: the ranks compare equal (benchmarks/faults
    diverge-nan-4r was `ok`). The probe sums this rank's own gradient before the all-reduce; the analysis reports
    any non-finite gradient or parameter and names the rank whose own gradient was."""
    import copy
    import json
    import math

    import msgspec
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddpdoctor.analyses.sync import analyze_sync
    from ddpdoctor.findings.sync import sync_findings
    from ddpdoctor.probes.steps import StepTracker
    from ddpdoctor.probes.sync import install_check_sync
    from ddpdoctor.rundir.layout import RunDir
    from ddpdoctor.rundir.schema import SyncRecord

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    tracker = StepTracker()
    tracker.install()
    (tmp_path / "ranks" / "rank0").mkdir(parents=True)
    probe = install_check_sync(RunDir(tmp_path), 0, 2, {"steps": 0}, tracker)
    try:
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for it in range(4):
            opt.zero_grad()
            loss = model(torch.randn(3, 4)).sum()
            (loss * math.nan if it == 2 else loss).backward()
            opt.step()
        mine = json.loads(json.dumps(probe.record()))
    finally:
        probe.uninstall()
        tracker.uninstall()
        dist.destroy_process_group()
    assert [r["local_nonfinite"] for r in mine["grads"]] == [False, False, True, False]
    peer = copy.deepcopy(mine)  # a peer: the same all-reduced NaN, its own gradient finite
    peer["rank"] = 0
    for row in peer["grads"]:
        row["local_nonfinite"] = False
    records = {r: msgspec.convert(doc, SyncRecord) for r, doc in ((0, peer), (2, mine))}
    analysis = analyze_sync(records)
    assert not analysis.grads.diverged and not analysis.params.diverged  # equal NaN: nothing differs
    [f] = [f for f in sync_findings(analysis) if f.id == "nonfinite-values"]
    assert f.severity.value == "error" and f.ranks == [2]
    assert f.evidence["step"] == 2 and f.evidence["tensors"] == ["weight", "bias"]
    assert f.evidence["also"] == ["param from step 2"]

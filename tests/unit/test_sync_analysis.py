"""check-sync's pure parts: fingerprints, their comparison, and the findings, against numbers worked out by hand."""

from __future__ import annotations

import math

import msgspec
import torch

from ddpdoctor.analyses.data_shards import analyze_data
from ddpdoctor.analyses.sync import RTOL, analyze_sync, compare_fingerprints
from ddpdoctor.findings.sync import sync_findings
from ddpdoctor.findings.sync_data import data_findings
from ddpdoctor.probes.equivalence import relative_error
from ddpdoctor.probes.fingerprints import fingerprints
from ddpdoctor.rundir.schema import DataRecord, SyncRecord


def _typed(records, schema):
    """The records as the run directory's typed loader gives them (rundir/loaders.py)."""
    return {r: msgspec.convert(v, schema) for r, v in records.items()}


def analyze_sync_json(records):
    return analyze_sync(_typed(records, SyncRecord))


def analyze_data_json(data, world_size=None):
    return analyze_data(_typed(data, DataRecord), world_size)




def test_fingerprint_by_hand():
    t = torch.tensor([[1.0, -2.0, 3.0], [4.0, 0.5, -1.0]])
    # numel 6; sum 5.5; squares 1+4+9+16+0.25+1 = 31.25; samples at (k*5)//3 = 0, 1, 3, 5 -> 1, -2, 4, -1
    assert fingerprints([t, None]) == [[6.0, 5.5, 31.25, 1.0, -2.0, 4.0, -1.0], None]
    assert fingerprints([torch.tensor([7.0])]) == [[1.0, 7.0, 49.0, 7.0, 7.0, 7.0, 7.0]]


def test_compare_fingerprints():
    a = [4.0, 10.0, 30.0, 1.0, 2.0, 3.0, 4.0]
    assert compare_fingerprints(a, list(a)) == (True, 0.0, 0.0)
    b = [4.0, 10.5, 30.0, 1.0, 2.0, 3.5, 4.0]
    # abs: max(|10-10.5|, |3-3.5|) = 0.5; rel: 0.5/10.5 and 0.5/3.5 -> 0.142857...
    equal, abs_d, rel_d = compare_fingerprints(a, b)
    assert not equal and abs_d == 0.5 and math.isclose(rel_d, 0.5 / 3.5)
    assert compare_fingerprints(a, None) == (False, math.inf, math.inf)
    # A sum that cancels to ~0 is judged against sqrt(n * sum of squares) = sqrt(1e6 * 1e6) = 1e6, not against itself.
    c = [1e6, 1e-6, 1e6, 0.5, 0.5, 0.5, 0.5]
    equal, abs_d, rel_d = compare_fingerprints(c, [1e6, 3e-6, 1e6, 0.5, 0.5, 0.5, 0.5])
    assert not equal and math.isclose(abs_d, 2e-6) and math.isclose(rel_d, 2e-6 / 1e6)
    nan = [4.0, "nan", "nan", 1.0, "nan", 3.0, 4.0]  # NaN gradients on both ranks agree (a NaN is not a sync bug)
    assert compare_fingerprints(nan, list(nan))[0]
    assert compare_fingerprints(nan, a) == (False, math.inf, math.inf)


def _sync_record(rank, grads, params, buffers=(), reduced=True, modules=None):
    return {
        "rank": rank, "world_size": 2, "stop_after": 2, "steps_completed": 2,
        "modules": modules or [{"index": 0, "params": ["w", "b"], "buffers": ["bn.running_mean"],
                                "batchnorm_buffers": ["bn.running_mean"], "broadcast_buffers": False}],
        "grads": [{"step": s, "module": 0, "reduced": reduced, "unsynced_forwards": 0 if reduced else 1, "fp": fp}
                  for s, fp in enumerate(grads)],
        "params": [{"step": s, "module": 0, "fp": fp} for s, fp in enumerate(params)],
        "buffers": [{"step": s, "module": 0, "synced_by_ddp": False, "fp": fp} for s, fp in enumerate(buffers)],
        "optimizer_params_outside_ddp": [], "equivalence": None,
    }


W = [2.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
B = [1.0, 3.0, 9.0, 3.0, 3.0, 3.0, 3.0]


def test_param_divergence_names_step_ranks_and_size():
    w_bad = [2.0, 1.25, 1.0, 0.5, 0.75, 0.5, 0.5]  # sum +0.25, one sample +0.25
    records = {0: _sync_record(0, [[W, B]] * 2, [[W, B], [W, B]]), 1: _sync_record(1, [[W, B]] * 2, [[W, B], [w_bad, B]])}
    analysis = analyze_sync_json(records)
    assert analysis.grads.diverged == [] and analysis.params.comparisons == 4
    (d,) = analysis.params.diverged
    assert (d.step, d.name, d.ranks, d.reference_rank, d.max_abs_diff) == (1, "w", [1], 0, 0.25)
    assert math.isclose(d.max_rel_diff, 0.25 / 0.75)
    (f,) = sync_findings(analysis)
    assert f.id == "param-divergence" and f.severity.value == "error" and f.evidence["parameters"] == ["w"]


def test_tiny_difference_is_within_tolerance_and_info():
    w_close = [2.0, 1.0 + 1e-9, 1.0, 0.5, 0.5, 0.5, 0.5]
    records = {0: _sync_record(0, [[W, B]], [[W, B]]), 1: _sync_record(1, [[w_close, B]], [[W, B]])}
    analysis = analyze_sync_json(records)
    assert analysis.grads.diverged == [] and len(analysis.grads.within_tolerance) == 1
    assert 1e-9 / (1 + 1e-9) <= RTOL
    (f,) = sync_findings(analysis)
    assert f.id == "grad-divergence" and f.severity.value == "info"


def test_no_sync_unused_and_batchnorm_drift():
    g0 = [[W, None]]  # parameter "b" never gets a gradient
    buf0, buf1 = [[B], [B]], [[B], [[1.0, 3.5, 9.0, 3.0, 3.0, 3.5, 3.0]]]
    records = {0: _sync_record(0, g0, [[W, B]], buf0, reduced=False), 1: _sync_record(1, g0, [[W, B]], buf1, reduced=False)}
    analysis = analyze_sync_json(records)
    assert [(u.step, u.ranks) for u in analysis.never_synced] == [(0, [0, 1])]
    assert analysis.unused == {0: ["b"]}
    ids = {f.id: f for f in sync_findings(analysis)}
    assert set(ids) == {"grads-never-synced", "unused-parameters", "buffer-divergence"}
    bn = ids["buffer-divergence"]
    assert bn.severity.value == "warning" and bn.evidence["batchnorm"] and bn.evidence["step"] == 1


def test_equivalence_thresholds_and_relative_error():
    assert relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5  # max |d| 2 / max |g| 4
    base = _sync_record(0, [], [])
    base["equivalence"] = {"step": 1, "world_size": 2, "batch_sizes": [4, 4], "caveats": [],
                           "relative_error": {"w": 2e-7, "b": 5e-3}}
    (f,) = sync_findings(analyze_sync_json({0: base, 1: _sync_record(1, [], [])}))
    assert f.id == "ddp-equivalence" and f.severity.value == "error" and f.evidence["worst_parameter"] == "b"
    base["equivalence"]["caveats"] = ["batchnorm", "dropout"]
    (f,) = sync_findings(analyze_sync_json({0: base, 1: _sync_record(1, [], [])}))
    assert f.severity.value == "info"
    # BatchNorm alone: judged on each rank's batch run separately, which DDP must match exactly.
    base["equivalence"]["caveats"] = ["batchnorm"]
    base["equivalence"]["relative_error_per_rank_batches"] = {"w": 1e-7, "b": 3e-7}
    (f,) = sync_findings(analyze_sync_json({0: base, 1: _sync_record(1, [], [])}))
    assert f.severity.value == "info" and f.evidence["max_relative_error_per_rank_batches"] == 3e-7
    base["equivalence"]["relative_error_per_rank_batches"] = {"w": 1e-7, "b": 0.2}
    (f,) = sync_findings(analyze_sync_json({0: base, 1: _sync_record(1, [], [])}))
    assert f.severity.value == "error" and f.evidence["worst_parameter"] == "b"


def _loader(epochs, sampler=None, dataset_len=10, loader=0, **kw):
    return {"loader": loader, "dataset_len": dataset_len, "iterable": False, "subset": None, "sampler": sampler,
            "epochs": epochs, **kw}


def _epoch(i, indices, batches=None, steps=1):
    return {"epoch": i, "indices": indices, "order_hash": repr(indices),
            "batches": batches if batches is not None else len(indices), "steps": steps}


def _data(loaders, **kw):
    return {"loaders": loaders, "init_conflicts": [], "set_epoch_calls": 0, **kw}


def _findings(data):
    return {f.id: f for f in data_findings(analyze_data_json(data), 2)}


def test_distributed_sampler_padding_is_info():
    # 9 samples, 2 ranks, drop_last=False: total_size 10, rank 1 repeats sample 0.
    ds = {"class": "DistributedSampler", "distributed": True, "shuffle": False, "seed": 0, "drop_last": False, "total_size": 10}
    data = {0: _data([_loader([_epoch(0, [0, 2, 4, 6, 8])], ds, 9)]), 1: _data([_loader([_epoch(0, [1, 3, 5, 7, 0])], ds, 9)])}
    f = _findings(data)
    assert list(f) == ["sampler-overlap"] and f["sampler-overlap"].severity.value == "info"
    assert f["sampler-overlap"].evidence["padding_allowed"] == 1


def test_overlap_coverage_uneven_and_seed():
    s0 = {"class": "DistributedSampler", "distributed": True, "shuffle": True, "seed": 0, "drop_last": True, "total_size": 10}
    s1 = dict(s0, seed=1)
    data = {0: _data([_loader([_epoch(0, [0, 1, 2, 3], 2)], s0)]), 1: _data([_loader([_epoch(0, [2, 3, 4], 3)], s1)])}
    f = _findings(data)
    assert f["sampler-overlap"].evidence["shared_samples"] == 2 and f["sampler-overlap"].severity.value == "error"
    assert f["sampler-coverage"].evidence["missing"] == 5 and f["sampler-coverage"].evidence["examples"] == [5, 6, 7, 8, 9]
    assert f["sampler-uneven-batches"].evidence["batches"] == {"0": 2, "1": 3}
    assert f["sampler-seed-mismatch"].evidence["seeds"] == {"0": 0, "1": 1}


def test_same_order_every_epoch_and_loaders_without_steps_are_ignored():
    s = {"class": "DistributedSampler", "distributed": True, "shuffle": True, "seed": 0, "drop_last": False, "total_size": 4}
    epochs0 = [_epoch(0, [3, 0]), _epoch(1, [3, 0])]
    epochs1 = [_epoch(0, [1, 2]), _epoch(1, [1, 2])]
    val = _loader([_epoch(0, [0, 1, 2, 3], steps=0)], None, 4, loader=1)  # every rank runs all of it: fine
    data = {0: _data([_loader(epochs0, s, 4), val]), 1: _data([_loader(epochs1, s, 4), val])}
    f = _findings(data)
    assert list(f) == ["sampler-no-set-epoch"] and f["sampler-no-set-epoch"].evidence["epochs_same_as_first"] == [1]


def test_an_extra_loader_on_one_rank_does_not_shift_the_match():
    s = {"class": "DistributedSampler", "distributed": True, "shuffle": False, "seed": 0, "drop_last": False, "total_size": 4}
    extra = _loader([_epoch(0, [0, 1, 2, 3], steps=0)], None, 4, loader=0)
    data = {0: _data([extra, _loader([_epoch(0, [0, 2])], s, 4, loader=1)]), 1: _data([_loader([_epoch(0, [1, 3])], s, 4)])}
    analysis = analyze_data_json(data)
    assert [(e.loader, e.overlap, e.missing) for e in analysis.epochs] == [(1, 0, 0)]
    assert data_findings(analysis, 2) == []


def test_capped_endless_samplers_compare_one_shard_per_rank():
    # 4 samples, 2 ranks: each rank's first 2 indices are its shard; later passes wrap around and would "overlap".
    e0 = {**_epoch(0, [0, 1, 2, 3, 0, 1]), "truncated": True, "batches": None}
    e1 = {**_epoch(0, [2, 3, 0, 1, 2, 3]), "truncated": True, "batches": None}
    analysis = analyze_data_json({0: _data([_loader([e0], None, 4)]), 1: _data([_loader([e1], None, 4)])})
    assert [(e.overlap, e.missing) for e in analysis.epochs] == [(0, None)]


def test_subset_shards_compared_in_the_underlying_dataset():
    def loader(h, root):
        return _loader([{**_epoch(0, [0, 1, 2]), "root_indices": root}], None, 3,
                       subset={"root_class": "TensorDataset", "root_len": 8, "hash": h})

    f = _findings({0: _data([loader("a", [0, 1, 2])]), 1: _data([loader("b", [2, 3, 4])])})
    assert f["sampler-overlap"].evidence["examples"] == [2] and f["sampler-coverage"].evidence["missing"] == 3


def test_shuffle_conflict_is_reported():
    data = {0: _data([], init_conflicts=[{"error": "sampler option is mutually exclusive with shuffle",
                                          "sampler": "DistributedSampler"}]), 1: _data([])}
    f = _findings(data)
    assert f["sampler-shuffle-conflict"].ranks == [0]


def _opt_record(rank, calls_by_step, state_by_step, buffers_by_step=None):
    """A no-DDP (FSDP2) rank: one AdamW whose step counts are recorded at each step end, one buffer."""
    from ddpdoctor.probes.sync import _step_counts

    class _Opt:
        def __init__(self, steps):
            self.state = {i: {"step": torch.tensor(float(s))} for i, s in enumerate(steps)}

    rows = [{"step": step, "module": 0, "fp": fingerprints(_step_counts(_Opt(state_by_step[step]), calls))}
            for step, calls in enumerate(calls_by_step)]
    buffers = [{"step": step, "module": 0, "synced_by_ddp": False, "fp": fingerprints([torch.tensor(v)])}
               for step, v in enumerate(buffers_by_step or [])]
    return {"rank": rank, "world_size": 2, "stop_after": 3, "steps_completed": 3,
            "modules": [{"index": 0, "ddp": False, "module_class": "optimizer parameters", "params": ["w"],
                         "buffers": ["7.scale"], "batchnorm_buffers": []}],
            "grads": [], "params": [], "buffers": buffers, "optimizers": ["AdamW"], "optimizer_steps": rows}


def test_optimizer_step_counts_compare_exactly_and_name_the_rank_that_skipped():
    # rank 1 skipped its step at step 1 (both parameters' state['step'] stay 1), after a million steps: one step
    # apart is 1e-6 relative, under RTOL, and still a divergence (counts are exact)
    base = 1_000_000
    r0 = _opt_record(0, [base + 1, base + 2, base + 3], [[base + 1] * 2, [base + 2] * 2, [base + 3] * 2])
    r1 = _opt_record(1, [base + 1, base + 1, base + 2], [[base + 1] * 2, [base + 1] * 2, [base + 2] * 2])
    a = analyze_sync_json({0: r0, 1: r1})
    # 2 counts (calls, state) x 3 steps x 1 rank against rank 0
    assert a.optimizer_steps.comparisons == 6 and a.optimizer_steps.first_step == 1
    assert [d.name for d in a.optimizer_steps.diverged if d.step == 1] == ["AdamW.step() calls", "AdamW state['step']"]
    assert not a.optimizer_steps.within_tolerance
    assert a.optimizer_step_values == {0: [base + 2, base + 2, base + 2], 1: [base + 1, base + 1, base + 1]}
    (f,) = [f for f in sync_findings(a) if f.id == "optimizer-steps-differ"]
    assert f.severity.value == "error" and f.ranks == [1]
    assert f.evidence["step"] == 1 and f.evidence["step_calls"] == {"0": base + 2, "1": base + 1}
    assert "rank 1 than on rank 0 from step 1: 1000001 step() call(s) against 1000002" in f.title
    healthy = analyze_sync_json({0: r0, 1: _opt_record(1, [base + 1, base + 2, base + 3], [[base + 1] * 2,
                                                                                           [base + 2] * 2,
                                                                                           [base + 3] * 2])})
    assert healthy.optimizer_steps.comparisons == 6 and not healthy.optimizer_steps.diverged
    assert not [f for f in sync_findings(healthy) if f.id in ("optimizer-steps-differ", "nothing-compared")]


def test_a_buffer_that_differs_without_ddp_is_an_error_in_fsdp2_terms():
    r0 = _opt_record(0, [1, 2], [[1], [2]], [[0.5, 0.5], [0.5, 0.5]])
    r1 = _opt_record(1, [1, 2], [[1], [2]], [[0.5, 0.5], [0.505, 0.505]])
    a = analyze_sync_json({0: r0, 1: r1})
    assert a.buffers.comparisons == 2 and a.buffers.first_step == 1
    (f,) = [f for f in sync_findings(a) if f.id == "buffer-divergence"]
    assert f.severity.value == "error" and f.ranks == [1] and f.evidence["ddp"] is False
    assert "7.scale" in f.title and "nothing broadcasts buffers" in f.title
    assert "DDP does not broadcast" not in f.title and "broadcast_buffers" not in f.advice

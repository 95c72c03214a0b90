"""check-sync's probe guard, the equivalence helpers for any output shape, and shard causes: pure, in one process."""

from __future__ import annotations

import dataclasses
import json

import msgspec
import pytest
import torch

from ddpdoctor.analyses.data_shards import analyze_data, shard_cause
from ddpdoctor.findings.sync_data import data_findings
from ddpdoctor.probes.equivalence import _output_tensors, _union
from ddpdoctor.probes.guard import NOTES_FILE, Guard, ProbeNotes, read_probe_notes
from ddpdoctor.rundir.schema import DataRecord, LoaderRecord


def _typed(records, schema):
    """The records as the run directory's typed loader gives them (rundir/loaders.py)."""
    return {r: msgspec.convert(v, schema) for r, v in records.items()}


def analyze_data_json(data, world_size=None):
    return analyze_data(_typed(data, DataRecord), world_size)


def shard_cause_json(loaders, world_size):
    return shard_cause(_typed(loaders, LoaderRecord), world_size)




def test_guard_notes_a_failure_switches_off_and_lets_a_stop_through(tmp_path):
    notes = ProbeNotes(tmp_path / "rank1" / NOTES_FILE)
    guard = Guard("data", notes, lambda: 7)
    calls = []

    def boom(x):
        calls.append(x)
        raise ValueError("zero-dimensional tensor cannot be concatenated")

    assert guard.call("a hook", boom, 1) is None and not guard.enabled
    assert guard.call("a hook", boom, 2) is None and calls == [1]  # off: never called again
    (note,) = json.loads((tmp_path / "rank1" / NOTES_FILE).read_text())
    assert note["probe"] == "data" and note["where"] == "a hook" and note["step"] == 7
    assert note["error"] == "ValueError: zero-dimensional tensor cannot be concatenated"
    with pytest.raises(SystemExit):  # check-sync's clean stop is not a failure
        Guard("x", ProbeNotes(None)).call("stop", lambda: (_ for _ in ()).throw(SystemExit(0)))
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / NOTES_FILE).write_text(json.dumps([note]))
    (line,) = read_probe_notes({0: tmp_path / "rank0", 1: tmp_path / "rank1", 2: tmp_path / "absent"})
    assert "data probe failed in a hook at step 7 on rank(s) [0, 1]" in line and "ran on as without it" in line


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    loss: torch.Tensor
    note: str = "x"


def test_every_tensor_of_any_output_is_found_in_a_fixed_order():
    a, b, c = torch.ones(2, 3), torch.tensor(1.0), torch.zeros(2)
    assert _output_tensors(None) == [] and _output_tensors(3.5) == []
    assert [t.shape for t in _output_tensors((a, 0.5, {"l": b, "m": [c]}))] == [(2, 3), (), (2,)]
    assert [t.shape for t in _output_tensors(_Out(a, b))] == [(2, 3), ()]


def _gathered(*grads):
    return [{"args": (torch.ones(2, 4),), "kwargs": {}, "out_grads": list(g)} for g in grads]


def test_union_batch_only_when_outputs_have_a_batch_dimension():
    # A model returning its loss (0-d): no union batch, the check runs each rank's batch on its own.
    assert _union(_gathered([torch.tensor(0.5)], [torch.tensor(0.5)])) is None
    args, kwargs, grads = _union(_gathered([torch.ones(2, 3)], [torch.ones(2, 3)]))
    assert args[0].shape == (4, 4) and [g.shape for g in grads] == [(4, 3)]


def _loader(sampler: dict, *, length=16, subset=None, first="a", iterable=False):
    return {"loader": 0, "dataset_len": length, "iterable": iterable, "subset": subset, "batch_size": 4,
            "dataset_fp": {"len": length, "first": first, "last": "z"}, "sampler": sampler, "epochs": []}


DIST = {"class": "DistributedSampler", "distributed": True, "num_replicas": 2, "shuffle": True, "seed": 0}


@pytest.mark.parametrize(("ranks", "cause"), [
    ([_loader({**DIST, "rank": 0}), _loader({**DIST, "rank": 1})], None),
    ([_loader({**DIST, "rank": 0}, subset={"hash": "s0"}), _loader({**DIST, "rank": 1}, subset={"hash": "s1"})],
     "dataset-differs"),
    ([_loader({**DIST, "rank": 0}, first="a"), _loader({**DIST, "rank": 1}, first="b")], "dataset-differs"),
    ([_loader({**DIST, "rank": 0, "seed": 0}), _loader({**DIST, "rank": 1, "seed": 1})], "seed-differs"),
    ([_loader({**DIST, "rank": 0}), _loader({**DIST, "rank": 0})], "sampler-rank"),
    ([_loader({"class": "RandomSampler", "distributed": False, "shuffle": True})] * 2, "shuffle-no-distributed-sampler"),
    ([_loader({"class": "SequentialSampler", "distributed": False})] * 2, "no-distributed-sampler"),
    # accelerate loaded, the loader not prepared (a prepared one is sharded_by its BatchSamplerShard)
    ([_loader({"class": "RandomSampler", "distributed": False, "shuffle": True, "framework": "accelerate"})] * 2,
     "accelerate-not-prepared"),
    ([_loader({"class": "SequentialSampler", "distributed": False}, subset={"hash": "s0"}),
      _loader({"class": "SequentialSampler", "distributed": False}, subset={"hash": "s1"})], "hand-made-shards"),
])
def test_shard_cause(ranks, cause):
    assert shard_cause_json(dict(enumerate(ranks)), 2) == cause


def test_a_varying_sample_does_not_make_the_dataset_differ():
    a = _loader({**DIST, "rank": 0}, first="a")
    b = _loader({**DIST, "rank": 1}, first="b")
    a["dataset_fp"]["varies"] = b["dataset_fp"]["varies"] = True  # random augmentation
    assert shard_cause_json({0: a, 1: b}, 2) is None


def _epoch(indices, steps, **extra):
    return {"epoch": extra.pop("epoch", 0), "indices": indices, "batches": len(indices) // 2, "len": len(indices) // 2,
            "batches_yielded": len(indices) // 2, "steps": steps, "order_hash": extra.pop("order", "h"), **extra}


def test_datasets_of_other_lengths_are_an_error_naming_the_cause():
    a = _loader({**DIST, "rank": 0}, length=10)
    b = _loader({**DIST, "rank": 1}, length=12)
    a["epochs"], b["epochs"] = [_epoch([0, 1], 1)], [_epoch([2, 3], 1)]
    (f,) = data_findings(analyze_data_json({0: {"loaders": [a]}, 1: {"loaders": [b]}}), 2)
    assert f.id == "sampler-dataset-differs" and f.severity.value == "error"
    assert "an unseeded random_split" in f.title and "generator=torch.Generator().manual_seed" in f.advice


def test_peeks_are_not_epochs_and_the_epoch_length_is_estimated():
    def rank(r, order2):
        ld = _loader({**DIST, "rank": r})
        ld["epochs"] = [
            {"epoch": 0, "batches_yielded": 1, "steps": 0, "peek": True, "order_hash": "A"},  # next(iter(loader))
            _epoch(list(range(r, 16, 2)), 4, epoch=1, order="A"),
            {"epoch": 2, "batches_yielded": 1, "steps": 0, "peek": True, "order_hash": "A"},
            _epoch(list(range(r, 16, 2)), 1, epoch=3, order=order2),
        ]
        return {"loaders": [ld], "set_epoch_calls": 1}

    ok = analyze_data_json({0: rank(0, "B"), 1: rank(1, "B")})
    assert [e.epoch for e in ok.epochs] == [0, 1] and data_findings(ok, 2) == []
    assert ok.loaders[0].steps_per_epoch == 4 and ok.loaders[0].steps_seen == 5
    bad = analyze_data_json({0: rank(0, "A"), 1: rank(1, "A")})  # set_epoch missing: epoch 1 repeats epoch 0's order
    assert [f.id for f in data_findings(bad, 2)] == ["sampler-no-set-epoch"]


def test_one_epoch_note_says_how_many_steps_it_would_take():
    from ddpdoctor.analyses.data_shards import LoaderFacts
    from ddpdoctor.reports.check_sync import _one_epoch_note

    facts = LoaderFacts(loader=0, sampler={}, epochs_seen={0: 1}, same_order_epochs={}, sampler_epochs={},
                        steps_per_epoch=1250)
    note = _one_epoch_note(facts, 505, 5, 500)
    assert "did not reach a second epoch in the 505 step(s)" in note and "an epoch is 1250 steps" in note
    assert note.endswith("run with --data-steps 1246 (or --steps 0) to reach the second one")
    assert "--data-steps" not in _one_epoch_note(facts, 1000, 0, 500)  # --steps 0: the script ran to its end


def test_check_sync_and_run_print_the_run_directory():
    from rich.console import Console

    from ddpdoctor.commands.run import _sections
    from ddpdoctor.renderers.console_sync import render_sync_sections
    from ddpdoctor.report import Report

    for render, command in ((render_sync_sections, "check-sync"), (_sections, "run")):
        out = Console(width=200, record=True)
        render(Report(command=command, sections={"run_dir": "ddpdoctor-runs/x"}), out, False)
        assert "run directory: ddpdoctor-runs/x" in out.export_text()


def test_an_output_computed_from_another_is_not_backpropagated_twice():
    from ddpdoctor.probes.equivalence import _sinks

    w = torch.ones(3, requires_grad=True)
    logits = w * 2
    loss = logits.sum() + (w ** 2).sum()  # from logits, plus a term of its own (an auxiliary loss)
    other = w * 3  # independent of both
    assert _sinks([logits, loss, other]) == [1, 2] and _sinks([logits]) == [0]


def test_accelerate_is_recorded_and_its_unprepared_loader_gets_advice_in_its_terms(monkeypatch):
    """The sampler probe records accelerate when it is loaded (not under the HF Trainer, which prepares its own
    loaders), and the overlap cause then says prepare(), not DistributedSampler (docs/check-sync.md#frameworks)."""
    import sys
    import types

    from ddpdoctor.analyses.data_shards import CAUSES
    from ddpdoctor.findings.sync_data import _CAUSE_ADVICE
    from ddpdoctor.probes.sampler_facts import framework_facts

    for name in ("lightning", "pytorch_lightning", "transformers.trainer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "accelerate", types.ModuleType("accelerate"))
    assert framework_facts() == {"framework": "accelerate"}
    monkeypatch.setitem(sys.modules, "transformers.trainer", types.ModuleType("transformers.trainer"))
    assert framework_facts() == {}
    assert set(CAUSES) <= set(_CAUSE_ADVICE)
    advice = _CAUSE_ADVICE["accelerate-not-prepared"]
    assert "accelerator.prepare(" in advice and "DistributedSampler" in advice.split("not by a")[1][:25]

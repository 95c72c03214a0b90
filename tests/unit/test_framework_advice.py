"""Advice in the framework's terms where a framework builds DDP itself (issue 27): the DDP recorder notes which
framework's code was on the stack at construction, and advice names the framework's own option."""

from __future__ import annotations

import pytest

from ddpdoctor.analyses.bucket_replay import MIB
from ddpdoctor.findings import perf
from ddpdoctor.findings.framework_advice import comm_hook, ddp_option, framework_of_files
from ddpdoctor.findings.perf import perf_findings
from ddpdoctor.findings.tune import code_line
from ddpdoctor.probes import ddp_recorder
from ddpdoctor.rundir.schema import DDPModule
from tests.unit.analysis_builders import analysis, fit, grads, rank, step


def _built_from(path: str) -> str | None:
    """ddp_recorder._built_by() as called from code in ``path`` (a framework's file on the stack)."""
    scope: dict[str, object] = {"built_by": ddp_recorder._built_by}
    exec(compile("result = built_by()", path, "exec"), scope)  # noqa: S102 - a frame named after the file
    return scope["result"]  # type: ignore[return-value]


def test_the_framework_on_the_stack_is_recorded() -> None:
    assert _built_from("/venv/lib/python3.11/site-packages/transformers/trainer.py") == "transformers"
    assert _built_from("/venv/lib/python3.11/site-packages/lightning/pytorch/strategies/ddp.py") == "lightning"
    assert _built_from("/venv/lib/python3.11/site-packages/accelerate/accelerator.py") == "accelerate"
    assert _built_from("/home/me/train.py") is None


def test_advice_in_the_frameworks_terms() -> None:
    assert ddp_option({"built_by": "transformers"}, "find_unused_parameters", False) == (
        "`TrainingArguments(ddp_find_unused_parameters=False)` (the HF Trainer builds DDP itself)")
    assert "DDPStrategy(find_unused_parameters=False)" in ddp_option({"built_by": "lightning"},
                                                                   "find_unused_parameters", False)
    assert "DistributedDataParallelKwargs(static_graph=True)" in ddp_option({"built_by": "accelerate"},
                                                                           "static_graph", True)
    # plain PyTorch, or an option the framework does not expose: DDP's own
    assert ddp_option({}, "find_unused_parameters", False) == "`DDP(model, find_unused_parameters=False)`"
    assert ddp_option({"built_by": "transformers"}, "static_graph", True) == "`TrainingArguments(ddp_static_graph=True)`"


# ---- every DDP-option advice goes through ddp_option: bucket_cap_mb, comm hooks, broadcast_buffers, tune, logs ----

HF, PL, ACC = ({"built_by": "transformers"}, {"built_by": "lightning"}, {"built_by": "accelerate"})


def test_each_option_in_each_frameworks_terms() -> None:
    assert ddp_option(HF, "static_graph", True) == "`TrainingArguments(ddp_static_graph=True)`"
    assert ddp_option(HF, "broadcast_buffers", False) == "`TrainingArguments(ddp_broadcast_buffers=False)`"
    assert ddp_option(PL, "bucket_cap_mb", 50.0) == "`Trainer(strategy=DDPStrategy(bucket_cap_mb=50))`"
    assert ddp_option(ACC, "gradient_as_bucket_view", True) == (
        "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view=True)])`")
    # TrainingArguments.ddp_bucket_cap_mb is an int: a quarter of 25 MB is said as 6
    assert ddp_option(HF, "bucket_cap_mb", 6.25) == "`TrainingArguments(ddp_bucket_cap_mb=6)`"
    assert ddp_option({}, "bucket_cap_mb", 6.25) == "`DDP(model, bucket_cap_mb=6.25)`"
    # an option the framework does not expose: DDP's spelling, and it says the framework has no setting for it
    assert ddp_option(HF, "gradient_as_bucket_view", True) == (
        "`DDP(model, gradient_as_bucket_view=True)` (the HF Trainer builds DDP and has no setting for "
        "gradient_as_bucket_view)")
    assert comm_hook(PL) == "`Trainer(strategy=DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook))`"
    assert "comm_hook=DDPCommunicationHookType.FP16" in comm_hook(ACC)
    assert comm_hook({}, plain="`fp16_compress_hook`") == "`fp16_compress_hook`"
    assert framework_of_files(["/x/site-packages/pytorch_lightning/trainer/trainer.py", "/home/me/t.py"]) == "lightning"
    assert framework_of_files(["/home/me/train.py"]) is None


def _bucket_whatif_run(built_by: str | None):
    """The what-if case of tests/unit/test_perf_findings.py (worked out there: cap 1 saves 270 us of a step)."""
    ddp = [{"bucket_cap_mb": 25.0, "find_unused_parameters": False, "static_graph": False,
            "gradient_as_bucket_view": False, "parameter_tensors": 4, "parameter_bytes": 4 * MIB,
            "parameters": [{"bytes": MIB}] * 4, "grad_ready_order": [3, 2, 1, 0], "buckets": [{"bytes": 4 * MIB}],
            "built_by": built_by}]
    return analysis([rank(0, [step(i, start=i * 1000.0, dur=1000.0, comm=500, exposed=400, bw=(i * 1000.0 + 100,
                                                                                              i * 1000.0 + 500))
                              for i in range(3)])],
                    ddp=ddp, grad_ready=grads(0, 0, [(200, MIB), (300, MIB), (400, MIB), (500, MIB)]),
                    bandwidth=fit(10, MIB / 100))


@pytest.mark.parametrize("built_by,advice", [
    (None, "`DDP(model, bucket_cap_mb=1)`"),
    ("transformers", "`TrainingArguments(ddp_bucket_cap_mb=1)`"),
    ("lightning", "`Trainer(strategy=DDPStrategy(bucket_cap_mb=1))`"),
    ("accelerate", "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb=1)])`"),
])
def test_bucket_cap_advice_is_in_the_terms_of_the_framework_that_built_ddp(built_by, advice) -> None:
    found = {f.id: f for f in perf_findings(_bucket_whatif_run(built_by))}
    assert found["exposed-comm-high"].advice.startswith(advice + ": the bucket what-if predicts 0.27 ms")
    # the same cap in any spelling is one advice, said once by the lead finding
    assert found["bucket-cap-whatif"].advice == "See exposed-comm-high."


@pytest.mark.parametrize("cfg,tail,expect", [
    ({"bucket_cap_mb": 100, "built_by": "lightning"}, False, "`Trainer(strategy=DDPStrategy(bucket_cap_mb=25))`"),
    ({"bucket_cap_mb": 25, "built_by": "transformers"}, True, "`TrainingArguments(ddp_bucket_cap_mb=6)`"),
    ({"bucket_cap_mb": 1, "built_by": "lightning"}, True, "DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook)"),
    ({"bucket_cap_mb": 40}, True, "`DDP(model, bucket_cap_mb=10)`"),
])
def test_smaller_cap_and_hook_advice_without_a_whatif(cfg, tail, expect) -> None:
    assert expect in perf._smaller_cap_advice(DDPModule(**cfg), tail=tail)


def test_tune_prints_the_line_to_change_in_the_frameworks_terms() -> None:
    assert code_line({"bucket_cap_mb": 100.0}) == "`DDP(model, bucket_cap_mb=100)`"
    assert code_line({"bucket_cap_mb": 100.0}, HF) == "`TrainingArguments(ddp_bucket_cap_mb=100)`"
    assert code_line({"static_graph": True}, PL) == "`Trainer(strategy=DDPStrategy(static_graph=True))`"
    assert code_line({"comm_hook": "fp16"}, ACC) == (
        "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)])`")


def test_broadcast_buffers_advice_from_check_sync_in_the_frameworks_terms() -> None:
    from ddpdoctor.findings.sync import sync_findings
    from tests.unit.test_sync_analysis import B, W, _sync_record, analyze_sync_json

    modules = [{"index": 0, "params": ["w", "b"], "buffers": ["bn.running_mean"],
                "batchnorm_buffers": ["bn.running_mean"], "broadcast_buffers": False, "built_by": "transformers"}]
    buf1 = [[B], [[1.0, 3.5, 9.0, 3.0, 3.0, 3.5, 3.0]]]
    records = {r: _sync_record(r, [[W, W]] * 2, [[W, B]] * 2, [[B], [B]] if r == 0 else buf1, modules=modules)
               for r in (0, 1)}
    (bn,) = [f for f in sync_findings(analyze_sync_json(records)) if f.id == "buffer-divergence"]
    assert "`TrainingArguments(ddp_broadcast_buffers=True)` (the default)" in bn.advice


def test_logs_unused_parameters_advice_follows_the_framework_on_the_traceback() -> None:
    from ddpdoctor.logs.explain import explain_texts

    # DDP's own wording (torch 1.10+) under a Lightning traceback (frames as Lightning 1.x prints them)
    text = ("Traceback (most recent call last):\n"
            '  File "/home/me/train.py", line 380, in <module>\n    trainer.fit(model)\n'
            '  File "/env/lib/python3.8/site-packages/pytorch_lightning/trainer/trainer.py", line 513, in fit\n'
            "    self.dispatch()\n"
            '  File "/env/lib/python3.8/site-packages/torch/nn/parallel/distributed.py", line 692, in forward\n'
            "    if self.reducer._rebuild_buckets():\n"
            "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. "
            "This error indicates that your module has parameters that were not used in producing loss.\n"
            "Parameter indices which did not receive grad for rank 0: 35 36\n")
    (f,) = [f for f in explain_texts({"rank0.log": text}) if f.id == "unused-parameters"]
    assert "`Trainer(strategy=DDPStrategy(find_unused_parameters=True))`" in f.advice
    (plain,) = [f for f in explain_texts({"rank0.log": text.replace("pytorch_lightning", "mylib")})
                if f.id == "unused-parameters"]
    assert "pass find_unused_parameters=True to DistributedDataParallel" in plain.advice

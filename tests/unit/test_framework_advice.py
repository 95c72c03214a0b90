"""Advice in the framework's terms where a framework builds DDP itself (issue 27): the DDP recorder notes which
framework's code was on the stack at construction, and advice names the framework's own option."""

from __future__ import annotations

from ddpdoctor.findings.framework_advice import ddp_option
from ddpdoctor.probes import ddp_recorder


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
    assert ddp_option({"built_by": "transformers"}, "static_graph", True) == "`DDP(model, static_graph=True)`"

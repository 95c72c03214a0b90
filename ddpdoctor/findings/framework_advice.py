"""How to set one of DDP's options where a framework builds DDP itself (the HF Trainer, Lightning, accelerate):
advice says it in the framework's terms, from the framework the DDP module was built by (probes/ddp_recorder)."""

from __future__ import annotations

from typing import Any

from ddpdoctor.rundir.schema import DDPModule

# option -> framework -> how to set it to {value} (only options each framework exposes)
_HOW: dict[str, dict[str, str]] = {
    "find_unused_parameters": {
        "transformers": "`TrainingArguments(ddp_find_unused_parameters={value})` (the HF Trainer builds DDP itself)",
        "lightning": "`Trainer(strategy=DDPStrategy(find_unused_parameters={value}))` (Lightning builds DDP; the "
                     "strategy string \"ddp_find_unused_parameters_true\" is what turns it on)",
        "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters={value})])`",
    },
    "static_graph": {
        "lightning": "`Trainer(strategy=DDPStrategy(static_graph={value}))`",
        "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(static_graph={value})])`",
    },
    "gradient_as_bucket_view": {
        "lightning": "`Trainer(strategy=DDPStrategy(gradient_as_bucket_view={value}))`",
        "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(gradient_as_bucket_view={value})])`",
    },
    "bucket_cap_mb": {
        "transformers": "`TrainingArguments(ddp_bucket_cap_mb={value})`",
        "lightning": "`Trainer(strategy=DDPStrategy(bucket_cap_mb={value}))`",
        "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(bucket_cap_mb={value})])`",
    },
}


def ddp_option(cfg: DDPModule | None, option: str, value: Any) -> str:
    """`DDP(model, option=value)`, or the framework's way to set it when the framework built the DDP module."""
    framework = cfg.built_by if cfg else None
    how = _HOW.get(option, {}).get(framework or "")
    return how.format(value=value) if how else f"`DDP(model, {option}={value})`"

"""How to set one of DDP's options where a framework builds DDP itself (the HF Trainer, Lightning, accelerate):
advice says it in the framework's terms, from the framework the DDP module was built by (probes/ddp_recorder), or,
in a log, from the framework files on a traceback's stack."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ddpdoctor.rundir.schema import DDPModule, SyncModule

# option -> framework -> how to set it to {value} (only options each framework exposes). Checked against
# transformers 5.x TrainingArguments (ddp_find_unused_parameters, ddp_bucket_cap_mb, ddp_broadcast_buffers,
# ddp_static_graph; passed to accelerate's DistributedDataParallelKwargs in Trainer._build_accelerator_args),
# Lightning 2.x DDPStrategy (**kwargs go to DistributedDataParallel) and accelerate 1.x DistributedDataParallelKwargs.
_ACC = "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs({option}={value})])`"
_PL = "`Trainer(strategy=DDPStrategy({option}={value}))`"
_HOW: dict[str, dict[str, str]] = {
    "find_unused_parameters": {
        "transformers": "`TrainingArguments(ddp_find_unused_parameters={value})` (the HF Trainer builds DDP itself)",
        "lightning": "`Trainer(strategy=DDPStrategy(find_unused_parameters={value}))` (Lightning builds DDP; the "
                     "strategy string \"ddp_find_unused_parameters_true\" is what turns it on)",
        "accelerate": _ACC,
    },
    "static_graph": {"transformers": "`TrainingArguments(ddp_static_graph={value})`", "lightning": _PL,
                     "accelerate": _ACC},
    "gradient_as_bucket_view": {"lightning": _PL, "accelerate": _ACC},
    "bucket_cap_mb": {"transformers": "`TrainingArguments(ddp_bucket_cap_mb={value})`", "lightning": _PL,
                      "accelerate": _ACC},
    "broadcast_buffers": {"transformers": "`TrainingArguments(ddp_broadcast_buffers={value})`", "lightning": _PL,
                          "accelerate": _ACC},
}
_NAMES = {"transformers": "the HF Trainer", "lightning": "Lightning", "accelerate": "accelerate"}
# Gradient compression hooks: plain DDP registers them on the module; Lightning and accelerate take them as options.
_HOOKS: dict[str, dict[str, str]] = {
    "fp16": {"lightning": "`Trainer(strategy=DDPStrategy(ddp_comm_hook=default_hooks.fp16_compress_hook))`",
             "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                           "comm_hook=DDPCommunicationHookType.FP16)])`"},
    "bf16": {"lightning": "`Trainer(strategy=DDPStrategy(ddp_comm_hook=default_hooks.bf16_compress_hook))`",
             "accelerate": "`Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                           "comm_hook=DDPCommunicationHookType.BF16)])`"},
}
# The framework files a traceback passes through (the HF Trainer runs on accelerate: transformers first).
_FRAME_PARTS = (("transformers", "/transformers/"), ("lightning", "/lightning/"), ("lightning", "/pytorch_lightning/"),
                ("accelerate", "/accelerate/"))


def framework_of(cfg: DDPModule | SyncModule | Mapping[str, Any] | None) -> str:
    """The framework that built the DDP module ("" for a plain script): from the typed manifest entry, or from a
    plain record (check-sync's module description, tune's settings) that carries ``built_by``."""
    if cfg is None:
        return ""
    if isinstance(cfg, (DDPModule, SyncModule)):
        return cfg.built_by or ""
    return str(cfg.get("built_by") or "")


def _value(framework: str, option: str, value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if framework == "transformers" and option == "bucket_cap_mb" and isinstance(value, float):
        return max(1, round(value))  # TrainingArguments.ddp_bucket_cap_mb is an int (its command line parses one)
    return value


def ddp_option(cfg: DDPModule | SyncModule | Mapping[str, Any] | None, option: str, value: Any) -> str:
    """`DDP(model, option=value)`, or the framework's way to set it when the framework built the DDP module (and,
    when that framework has no setting for it, DDP's own spelling with a note that the framework does not expose it)."""
    framework = framework_of(cfg)
    value = _value(framework, option, value)
    how = _HOW.get(option, {}).get(framework)
    if how:
        return how.format(option=option, value=value)
    plain = f"`DDP(model, {option}={value})`"
    if framework in _NAMES:
        return f"{plain} ({_NAMES[framework]} builds DDP and has no setting for {option})"
    return plain


def comm_hook(cfg: DDPModule | Mapping[str, Any] | None, hook: str = "fp16", plain: str | None = None) -> str:
    """How to compress gradients with DDP's ``{hook}_compress_hook`` where the DDP module was built (``plain``: the
    wording for a plain DDP script, when the call site has a shorter one)."""
    framework = framework_of(cfg)
    how = _HOOKS.get(hook, {}).get(framework)
    if how:
        return how
    full = (f"`model.register_comm_hook(None, torch.distributed.algorithms.ddp_comm_hooks.default_hooks."
            f"{hook}_compress_hook)`")
    if framework not in _NAMES:
        return plain or full
    return f"{full} on the DDP module ({_NAMES[framework]} builds it and has no setting for a comm hook)"


def framework_of_files(files: Iterable[str]) -> str | None:
    """The framework whose files a traceback passes through ("transformers", "lightning", "accelerate"), else None."""
    seen = [f.replace("\\", "/") for f in files]
    for name, part in _FRAME_PARTS:
        if any(part in f for f in seen):
            return name
    return None

"""Remembers every DistributedDataParallel module the script builds, and describes its configuration and buckets."""

from __future__ import annotations

import weakref
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.probes.records import BucketDoc, DDPConfig, DDPModuleDoc, ParamDoc


def _ints(text: Any) -> list[int]:
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    return [int(x) for x in str(text).replace(",", " ").split()] if text not in (None, "") else []


class DDPRecorder:
    def __init__(self) -> None:
        # Each module with its reducer's parameter names as DDP built it: the reducer indexes the parameters that
        # required grad at construction, and a layer frozen later (fine-tuning schedules, ezpz#242) keeps its index.
        self._modules: list[tuple[weakref.ReferenceType[Any], DDPConfig, list[str]]] = []
        self._orig_init: Any = None
        self._last: list[DDPModuleDoc] = []
        self.process_group_created = False

    def install(self) -> None:
        orig = DistributedDataParallel.__init__
        recorder = self

        def __init__(ddp: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            orig(ddp, module, *args, **kwargs)
            try:
                recorder._modules.append((weakref.ref(ddp), recorder._config(ddp), _reducer_names(ddp)))
                recorder.describe()  # the initial layout, in case the script never reaches a later step
            except Exception:  # noqa: BLE001 - recording must never break the user's model
                pass

        self._orig_init = orig
        DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        if self._orig_init is not None:
            DistributedDataParallel.__init__ = self._orig_init  # type: ignore[method-assign]
            self._orig_init = None

    @property
    def count(self) -> int:
        return len(self._modules)

    def live_modules(self) -> list[Any]:
        return [m for ref, _, _ in self._modules if (m := ref()) is not None]

    @staticmethod
    def _config(ddp: Any) -> DDPConfig:
        cap = getattr(ddp, "bucket_bytes_cap", None)
        return {
            "module_class": type(ddp.module).__name__,
            "bucket_cap_mb": round(cap / (1024 * 1024), 3) if cap else None,
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", True)),
            "built_by": _built_by(),
        }

    def describe(self) -> list[DDPModuleDoc]:
        """Each DDP module: configuration, parameter count and bytes, and its bucket layout (as rebuilt
        after the first iterations, else the initial one). Modules already freed keep their last description."""
        import torch.distributed as dist

        out: list[DDPModuleDoc] = []
        # After destroy_process_group() the reducer's logger must not be touched (it can abort the process):
        # keep what was recorded while the group was alive.
        alive = dist.is_available() and dist.is_initialized()
        for i, (ref, config, names) in enumerate(self._modules):
            ddp = ref()
            if ddp is None or (not alive and i < len(self._last)):
                if i < len(self._last):
                    out.append(self._last[i])
                continue
            out.append(self._describe_one(ddp, config, alive, names))
        self._last = out
        return out

    @staticmethod
    def _describe_one(ddp: Any, config: DDPConfig, alive: bool, names: list[str]) -> DDPModuleDoc:
        # DDP's reducer indexes the parameters that required grad when it was built, in named_parameters() order.
        current = dict(ddp.module.named_parameters())
        named = [(n, current[n]) for n in names if n in current]
        ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
        parameters: list[ParamDoc] = [
            {"name": n, "numel": int(p.numel()), "bytes": int(p.numel() * p.element_size()), "dtype": str(p.dtype).replace("torch.", "")}
            for n, p in named
        ]
        data: dict[str, Any] = {}  # torch's own logging record of the module (raw, as DDP returns it)
        if alive:
            try:
                data = ddp._get_ddp_logging_data()
            except Exception:  # noqa: BLE001
                data = {}
        rebuilt = bool(data.get("has_rebuilt_buckets"))
        sizes = _ints(data.get("rebuilt_bucket_sizes" if rebuilt else "bucket_sizes", ""))
        indices_text = str(data.get("rebuilt_per_bucket_param_indices", "")) if rebuilt else ""
        per_bucket = [_ints(chunk) for chunk in indices_text.split(",")] if indices_text else []
        buckets: list[BucketDoc] = []
        for b, size in enumerate(sizes):
            idx = per_bucket[b] if b < len(per_bucket) else []
            buckets.append({
                "index": b,
                "bytes": size,
                "param_indices": idx,
                "params": [named[i][0] for i in idx if i < len(named)],
            })
        # The configuration's keys first, then these, in this order: info.json keeps its layout.
        return {
            **config,
            "parameter_count": int(sum(p.numel() for _, p in named)),
            "parameter_bytes": int(sum(p.numel() * p.element_size() for _, p in named)),
            "parameter_tensors": len(named),
            "parameters_ignored": sorted(ignored),
            "parameters": parameters,
            "buckets": buckets,
            "buckets_rebuilt": rebuilt,
            "grad_ready_order": _ints(data.get("prev_iteration_grad_ready_order_indices", "")),
            "iteration": int(data.get("iteration", 0) or 0),
            "world_size": int(data.get("world_size", 0) or 0),
            "backend": data.get("backend_name"),
            "bucket_cap_bytes": int(data.get("bucket_cap_bytes", 0) or 0) or None,
        }


# A framework that builds DDP itself, told by the files on the stack at construction (the HF Trainer builds it
# through accelerate, so transformers wins over accelerate).
_FRAMEWORKS = (("transformers", "/transformers/"), ("lightning", "/lightning/"), ("lightning", "/pytorch_lightning/"),
               ("accelerate", "/accelerate/"))


def _reducer_names(ddp: Any) -> list[str]:
    """The names of the parameters DDP's reducer indexes (``_build_params_for_reducer``): those that require grad
    at construction and are not ignored, in named_parameters() order."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return [n for n, p in ddp.module.named_parameters() if p.requires_grad and n not in ignored]


def _built_by() -> str | None:
    import sys

    files: list[str] = []
    frame = sys._getframe(1)
    while frame is not None and len(files) < 200:
        files.append(frame.f_code.co_filename.replace("\\", "/"))
        frame = frame.f_back  # type: ignore[assignment]
    for name, part in _FRAMEWORKS:
        if any(part in f for f in files):
            return name
    return None

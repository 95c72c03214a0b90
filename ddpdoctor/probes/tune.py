"""`ddpdoctor tune`'s probe in each rank: applies one variant of DDP's constructor options when the script builds
DistributedDataParallel, records the loss of each iteration, and stops every rank after the same iteration.

The script is not changed: the options are bound onto the script's own call of ``DistributedDataParallel(...)``
(keyword or positional), and a communication hook is registered right after the constructor returns, before the
first forward (docs/tune.md). FSDP2's knobs (forward/backward prefetch depth, ``reshard_after_forward``) are set on
the script's FSDP modules with FSDP2's own public setters at the end of its first iteration (a warm-up iteration:
the first ``--warmup`` are never measured), when no collective of theirs is in flight."""

from __future__ import annotations

import inspect
import math
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.analyses.tune import FSDP_OPTIONS, OPTIONS
from ddpdoctor.probes.records import RankStatusDoc, TuneApplied
from ddpdoctor.probes.steps import StepTracker
from ddpdoctor.rundir.layout import write_json

# Losses kept per rank: one float per iteration of a short trial.
MAX_LOSSES = 2000


def _hook(name: str) -> Any:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}[name]


class TuneProbe:
    """One trial's setting, applied to every DDP module the script builds; ``stop_after`` iterations, then every
    rank stops at that iteration's end (all ranks count the same iterations, so they stop together, outside any
    collective)."""

    def __init__(self, setting: dict[str, object], stop_after: int, tracker: StepTracker, out: Any,
                 fsdp_states: Any = None) -> None:
        self.setting = dict(setting)
        self.fsdp_states = fsdp_states  # () -> the FSDPStates the script built (probes/parallelism.py)
        self.stop_after = int(stop_after)
        self.tracker = tracker
        self.out = out  # this rank's tune.json
        self.applied: list[TuneApplied] = []  # per DDP module: the options it was built with, the hook
        self.errors: list[str] = []
        self.losses: list[tuple[int, Any]] = []  # (iteration, detached scalar tensor): read once, at the end
        self._orig_init: Any = None
        self._orig_backward: Any = None

    # -- DDP's constructor ------------------------------------------------------------------------------
    def install(self) -> None:
        """Before the DDP recorder installs its own wrapper (so that it records the options in effect); the
        caller adds ``on_step`` as the last step listener."""
        orig = DistributedDataParallel.__init__
        signature = inspect.signature(orig)
        probe = self

        def __init__(ddp: Any, *args: Any, **kwargs: Any) -> None:
            try:
                bound = signature.bind(ddp, *args, **kwargs)
            except TypeError:
                return orig(ddp, *args, **kwargs)  # let DDP itself say what is wrong with the call
            given = {k: bound.arguments.get(k) for k in OPTIONS if k in bound.arguments}
            for key in OPTIONS:
                if key in probe.setting:
                    bound.arguments[key] = probe.setting[key]
            orig(*bound.args, **bound.kwargs)
            record: TuneApplied = {"given": given, "options": {k: probe.setting[k] for k in OPTIONS
                                                                   if k in probe.setting}, "comm_hook": None}
            hook = probe.setting.get("comm_hook")
            if hook:
                try:
                    ddp.register_comm_hook(None, _hook(str(hook)))
                    record["comm_hook"] = str(hook)
                except Exception as exc:  # noqa: BLE001 - the trial then measures the baseline; reported as such
                    probe.errors.append(f"comm_hook={hook}: {type(exc).__name__}: {exc}")
            probe.applied.append(record)

        self._orig_init = orig
        DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign,assignment]
        self._install_loss()

    def _install_loss(self) -> None:
        import torch

        orig = torch.Tensor.backward
        probe = self

        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            # The scalar a script calls backward() on is its loss; kept detached (no sync on GPUs), read at the end.
            if tensor.numel() == 1 and len(probe.losses) < MAX_LOSSES:
                probe.losses.append((probe.tracker.step, tensor.detach()))
            return orig(tensor, *args, **kwargs)

        self._orig_backward = orig
        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]

    def uninstall(self) -> None:
        import torch

        if self._orig_init is not None:
            DistributedDataParallel.__init__ = self._orig_init  # type: ignore[method-assign]
            self._orig_init = None
        if self._orig_backward is not None:
            torch.Tensor.backward = self._orig_backward  # type: ignore[method-assign]
            self._orig_backward = None

    # -- the trial's end ----------------------------------------------------------------------------------
    def on_step(self, step: int) -> None:
        if step == 1 and any(k in self.setting for k in FSDP_OPTIONS):
            self.apply_fsdp()
        if step >= self.stop_after:
            from ddpdoctor.probes.profiler import ProfileWindowDone

            self.write()
            raise ProfileWindowDone(step)

    def apply_fsdp(self) -> None:
        """Set this trial's FSDP2 knobs on the script's units, in the order their modules appear under the root
        (named_modules' pre-order: the order a Sequential or a list of layers runs them in)."""
        try:
            states = list(self.fsdp_states() if self.fsdp_states is not None else [])
            units = fsdp_units_in_order(states)
            if not units:
                self.errors.append("the script built no FSDP2 unit with parameters: FSDP2's knobs were not set")
                return
            record: TuneApplied = {"given": {"units": len(units)}, "options": {}, "comm_hook": None}
            depth = self.setting.get("forward_prefetch")
            if depth is not None:
                n = int(depth)  # type: ignore[call-overload]
                for i, unit in enumerate(units):
                    unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + n])
                record["options"]["forward_prefetch"] = n
            depth = self.setting.get("backward_prefetch")
            if depth is not None:
                n = max(1, int(depth))  # type: ignore[call-overload]
                for i, unit in enumerate(units):
                    unit.set_modules_to_backward_prefetch(units[max(0, i - n):i][::-1])
                record["options"]["backward_prefetch"] = n
            if "reshard_after_forward" in self.setting:
                value = bool(self.setting["reshard_after_forward"])
                for unit in units:
                    unit.set_reshard_after_forward(value, recurse=False)
                record["options"]["reshard_after_forward"] = value
            self.applied.append(record)
        except Exception as exc:  # noqa: BLE001 - the trial then measures the baseline; reported as such
            self.errors.append(f"FSDP2 setting {self.setting}: {type(exc).__name__}: {exc}")

    def _loss_per_iteration(self) -> list[float | str | None]:
        """The mean loss of each iteration (several backward passes under gradient accumulation)."""
        sums: dict[int, list[float]] = {}
        for step, t in self.losses:
            try:
                sums.setdefault(step, []).append(float(t.float().item()))
            except Exception:  # noqa: BLE001
                continue
        if not sums:
            return []
        out: list[float | str | None] = []
        for i in range(max(sums) + 1):
            v = sums.get(i)
            mean = sum(v) / len(v) if v else None
            # JSON has no NaN: a non-finite loss is written as a string, so the analysis can say so.
            out.append(mean if mean is None or math.isfinite(mean) else str(mean))
        return out

    def write(self) -> None:
        try:
            write_json(self.out, {"setting": self.setting, "stop_after": self.stop_after, "applied": self.applied,
                                  "errors": self.errors, "loss_per_iteration": self._loss_per_iteration()})
        except OSError:
            pass  # a full disk must not change how the user's job ends

    def finish(self, status: RankStatusDoc) -> None:
        self.write()
        self.uninstall()


def fsdp_units_in_order(states: list[Any]) -> list[Any]:
    """The FSDP modules that manage parameters (units), in their root's named_modules order; the root (the module
    whose subtree holds the others) is left out, as torchtitan's explicit prefetch leaves it: it runs first and last."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for st in states for m in (getattr(st, "_modules", ()) or ())]
    inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
    roots = [m for m in modules if id(m) not in inner]
    out: list[Any] = []
    seen = {id(r) for r in roots}
    for root in roots:
        for m in root.modules():
            if isinstance(m, FSDPModule) and id(m) not in seen and _owns_unit(m):
                seen.add(id(m))
                out.append(m)
    return out


def _owns_unit(module: Any) -> bool:
    """Whether the FSDP module's state manages parameters: its parameter groups are not empty."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(state, "_fsdp_param_group", None)
        groups = [one] if one is not None else []
    return any(getattr(g, "fsdp_params", None) for g in groups)

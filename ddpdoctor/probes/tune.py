"""`ddpdoctor tune`'s probe in each rank: applies one variant of DDP's constructor options when the script builds
DistributedDataParallel, records the loss of each iteration, and stops every rank after the same iteration.

The script is not changed: the options are bound onto the script's own call of ``DistributedDataParallel(...)``
(keyword or positional), and a communication hook is registered right after the constructor returns, before the
first forward (docs/tune.md)."""

from __future__ import annotations

import inspect
import math
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.analyses.tune import OPTIONS
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

    def __init__(self, setting: dict[str, object], stop_after: int, tracker: StepTracker, out: Any) -> None:
        self.setting = dict(setting)
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
        if step >= self.stop_after:
            from ddpdoctor.probes.profiler import ProfileWindowDone

            self.write()
            raise ProfileWindowDone(step)

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

"""Which training iteration a rank is in, seen without touching the user's code.

An iteration ends at the first optimizer step (or GradScaler.step, which also ends iterations whose
step it skips) after the module's forward ran. Later optimizer steps in the same iteration (two
optimizers) are ignored until a forward runs again. ``ddpdoctor.step()`` switches to explicit mode."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

StepListener = Callable[[int], None]

_active: StepTracker | None = None


def active_tracker() -> StepTracker | None:
    return _active


class StepTracker:
    """Counts iterations and tells listeners (profiler, heartbeat, sync checks) when one ends.

    ``phase`` is a cheap hint for heartbeats: "forward", "backward", "optimizer", "data" or "other"."""

    def __init__(self) -> None:
        self.step = 0  # completed iterations
        self.phase = "startup"
        self.step_started = time.time()
        self.step_times: list[float] = []
        self._listeners: list[StepListener] = []
        self._armed = True  # a forward ran since the last iteration ended
        self._seen_forward = False
        self._explicit = False
        self._handles: list[Any] = []
        self._orig_scaler_step: Any = None
        self._lock = threading.Lock()

    def add_listener(self, fn: StepListener) -> None:
        self._listeners.append(fn)

    def install(self) -> None:
        global _active
        _active = self
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._on_optimizer_pre))
        self._handles.append(register_optimizer_step_post_hook(self._on_optimizer_post))
        self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(self._on_forward))
        self._patch_grad_scaler()

    def uninstall(self) -> None:
        global _active
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._orig_scaler_step is not None:
            torch.amp.GradScaler.step = self._orig_scaler_step  # type: ignore[method-assign]
            self._orig_scaler_step = None
        if _active is self:
            _active = None

    # -- hooks -------------------------------------------------------------------------------------
    def _on_forward(self, module: Any, args: Any) -> None:
        if not self._armed or self.phase != "forward":
            self._armed = True
            self._seen_forward = True
            self.phase = "forward"

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.phase = "optimizer"

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._explicit:
            self._end_iteration()

    def _patch_grad_scaler(self) -> None:
        scaler_cls = getattr(torch.amp, "GradScaler", None)
        if scaler_cls is None:
            return
        orig = scaler_cls.step
        tracker = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig(scaler, optimizer, *args, **kwargs)
            finally:
                # A skipped step (inf/nan grads) never calls optimizer.step(): it still ends the iteration.
                if not tracker._explicit:
                    tracker._end_iteration()

        self._orig_scaler_step = orig
        scaler_cls.step = step  # type: ignore[method-assign]

    # -- iteration boundaries -----------------------------------------------------------------------
    def explicit_step(self) -> None:
        self._explicit = True
        self._armed = True
        self._end_iteration()

    def _end_iteration(self) -> None:
        with self._lock:
            if self._seen_forward and not self._armed:
                return  # a second optimizer in the same iteration
            self._armed = False
            now = time.time()
            self.step_times.append(now - self.step_started)
            self.step_started = now
            self.step += 1
            self.phase = "data"  # until the next forward: usually the data loader
            step = self.step
        for fn in self._listeners:
            fn(step)

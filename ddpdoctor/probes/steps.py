"""Which training iteration a rank is in, seen without touching the user's code.

An iteration ends at the first optimizer step (or GradScaler.step, which also ends iterations whose
step it skips) after the module's forward ran. Later optimizer steps in the same iteration (two
optimizers) are ignored until a forward runs again. ``ddpdoctor.step()`` switches to explicit mode."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from ddpdoctor.analyses.ledger import CPU_TIME, CPU_WAIT

StepListener = Callable[[int], None]

_active: StepTracker | None = None
T = TypeVar("T")


def drain(q: deque[T]) -> list[T]:
    """Everything in ``q``, taken from another thread than the one appending (deque pops are atomic)."""
    out = []
    while True:
        try:
            out.append(q.popleft())
        except IndexError:
            return out


def active_tracker() -> StepTracker | None:
    return _active


class StepTracker:
    """Counts iterations and tells listeners (profiler, heartbeat, sync checks) when one ends.

    ``phase`` is a cheap hint for heartbeats: "forward", "backward", "optimizer", "data", "eval" (a forward with
    gradients off), "checkpoint" or "other". Setting it also times the phases of each iteration (the live health
    watch, ddpdoctor/live): ``recent`` holds the last iterations as (step, seconds, {phase: seconds}).

    "forward" is the wrapped model's forward: once a DDP, FSDP or fully_shard module has run, only such a module's
    forward switches the phase (a metric, a loss or a transform module outside it does not); a job without one
    keeps the first rule (any module). A module called while a DataLoader hands over a batch (transforms as modules
    in ``__getitem__``) never switches it: the time until the batch is handed over is "data"."""

    def __init__(self) -> None:
        self.step = 0  # completed iterations
        self._phase = "startup"
        self._phase_t = time.perf_counter()
        self._in_collective = 0
        self.phase_s: dict[str, float] = {}
        self.recent: deque[tuple[int, float, dict[str, float]]] = deque(maxlen=64)
        self.last_record: tuple[int, float, dict[str, float]] | None = None  # the iteration that just ended
        # When set (the ledger's NCCL source, probes/flight.py): takes each iteration's record with its wall-clock
        # start and end instead of ``recent``, and puts it there itself once the device's figures are in.
        self.hold: Callable[[tuple[int, float, dict[str, float]], float, float], bool] | None = None
        self.step_started = time.time()
        self.step_times: list[float] = []
        self._listeners: list[StepListener] = []
        self._armed = True  # a forward ran since the last iteration ended
        self._seen_forward = False
        self._explicit = False
        self._handles: list[Any] = []
        self._orig_scaler_step: Any = None
        self._orig_next: Any = None
        self._loading = 0  # inside a DataLoader iterator's __next__
        self._wrapped = False  # a DDP/FSDP module has run its forward: only those switch the phase from now on
        self.root_kind: str | None = None  # "DDP" or "FSDP": the first wrapped module whose forward ran
        self._root_types: tuple[type, ...] = _root_types()
        self._fsdp_pending = True
        self._lock = threading.Lock()
        self._main = threading.main_thread().ident
        self._runq_fd: int | None = None  # the training thread's schedstat, opened at its first iteration end
        self._runq_ns: int | None = None
        self._runq_off = False
        self._cpu_s = 0.0  # the process's CPU time at the last iteration's end (sent beside cpu_wait)

    # -- phase clock (a few hundred ns per change) ---------------------------------------------------
    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._account()
        self._phase = value

    def _account(self) -> None:
        now = time.perf_counter()
        key = "collective" if self._in_collective else self._phase
        self.phase_s[key] = self.phase_s.get(key, 0.0) + now - self._phase_t
        self._phase_t = now

    def collective_started(self) -> None:
        """A blocking collective began: its time counts as "collective", not as the phase that called it."""
        self._account()
        self._in_collective += 1

    def collective_ended(self) -> None:
        self._account()
        self._in_collective = max(0, self._in_collective - 1)

    def take_recent(self) -> list[tuple[int, float, dict[str, float]]]:
        """The iterations recorded since the last call (the heartbeat thread sends them; deque pops are atomic)."""
        return drain(self.recent)

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
        self._patch_data_loader()

    def uninstall(self) -> None:
        global _active
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._orig_scaler_step is not None:
            torch.amp.GradScaler.step = self._orig_scaler_step  # type: ignore[method-assign]
            self._orig_scaler_step = None
        if self._orig_next is not None:
            from torch.utils.data.dataloader import _BaseDataLoaderIter

            _BaseDataLoaderIter.__next__ = self._orig_next  # type: ignore[method-assign]
            self._orig_next = None
        if _active is self:
            _active = None

    # -- hooks -------------------------------------------------------------------------------------
    def _on_forward(self, module: Any, args: Any) -> None:
        if self._armed and self._phase == "forward":
            return  # the hot path: every submodule of a training forward
        if self._loading:
            return  # a transform in the data pipeline: still data loading
        if self._fsdp_pending and "torch.distributed.fsdp" in sys.modules:
            self._fsdp_pending = False  # the script imported FSDP: its classes are roots too (never imported here)
            self._root_types = self._root_types + _fsdp_types()
        if isinstance(module, self._root_types):
            if not self._wrapped:
                self.root_kind = "DDP" if _is_ddp(module) else "FSDP"
            self._wrapped = True
        elif self._wrapped or self._phase == "backward":
            return  # a metric, loss or helper module outside the wrapped model; a recomputation in backward
        phase = "forward" if torch.is_grad_enabled() else "eval"
        if not self._armed or self._phase != phase:
            self._armed = True
            self._seen_forward = True
            self.phase = phase

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

    def _patch_data_loader(self) -> None:
        try:
            from torch.utils.data.dataloader import _BaseDataLoaderIter
        except ImportError:
            return
        orig = _BaseDataLoaderIter.__next__
        tracker = self

        def __next__(it: Any) -> Any:
            if threading.get_ident() != tracker._main:
                return orig(it)
            tracker._loading += 1
            if tracker._phase != "data":
                tracker.phase = "data"  # until the next forward: the batch's copy to the device is data too
            try:
                return orig(it)
            finally:
                tracker._loading -= 1

        self._orig_next = orig
        _BaseDataLoaderIter.__next__ = __next__  # type: ignore[method-assign,assignment]

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
            self._account()
            use = self._cpu_use()
            if use is not None:
                self.phase_s[CPU_WAIT], self.phase_s[CPU_TIME] = use
            self.last_record = (self.step + 1, now - self.step_started, self.phase_s)
            if self.hold is None or not self.hold(self.last_record, self.step_started, now):
                self.recent.append(self.last_record)
            self.phase_s = {}
            self.step_started = now
            self.step += 1
            self.phase = "data"  # until the next forward: usually the data loader
            step = self.step
        for fn in self._listeners:
            fn(step)

    def _cpu_use(self) -> tuple[float, float] | None:
        """Seconds the training thread waited in the run queue, and the process's CPU seconds, since the last call;
        None where Linux does not say (no schedstat, another thread, the first iteration). One pread of an open file
        and one clock read, ~2 us."""
        if self._runq_off or threading.get_ident() != self._main:
            return None
        try:
            if self._runq_fd is None:
                self._runq_fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            ns = int(os.pread(self._runq_fd, 96, 0).split()[1])
        except (OSError, ValueError, IndexError):
            self._runq_off = True  # never again: no schedstat here
            return None
        cpu = time.process_time()
        last_ns, last_cpu = self._runq_ns, self._cpu_s
        self._runq_ns, self._cpu_s = ns, cpu
        return None if last_ns is None else (max(0, ns - last_ns) / 1e9, max(0.0, cpu - last_cpu))


def _is_ddp(module: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def backward_label(tracker: StepTracker) -> str:
    """What a rank in ``backward()`` waits on, for its status (findings/crash.py keys DDP's on this text)."""
    return {"DDP": "backward (DDP gradient all-reduce)", "FSDP": "backward (FSDP gradient reduce-scatter)"}.get(
        tracker.root_kind or "", "backward")


def _root_types() -> tuple[type, ...]:
    """The classes whose forward is "the model's forward": DDP here; FSDP's are added once imported (_fsdp_types)."""
    out: list[type] = []
    try:
        from torch.nn.parallel import DistributedDataParallel

        out.append(DistributedDataParallel)
    except ImportError:
        pass
    return tuple(out)


def _fsdp_types() -> tuple[type, ...]:
    """FSDP (FSDP1) and fully_shard's FSDPModule, once the script has imported them (importing them here would cost
    every rank seconds at start-up)."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:
        return ()
    return (FSDPModule, FullyShardedDataParallel)

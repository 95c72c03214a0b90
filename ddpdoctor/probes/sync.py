"""In-rank probe of `check-sync`: fingerprints gradients, parameters and buffers of every DDP module, step by step.

Each rank writes its own fingerprints (a few float64 numbers per tensor, never the tensors) to
ranks/rankR/sync.json, and what its DataLoaders yielded to ranks/rankR/data.json; the analysis compares
ranks offline, so the probe issues no collective on the user's process groups. Only ``--equivalence``
communicates: once, on a separate gloo group it creates, to gather each rank's batch.

When: gradients at the first optimizer step of an iteration (after every backward of the iteration,
so DDP has reduced them), parameters when the iteration ends, buffers when the wrapped module's
forward starts (after DDP has broadcast them, if it does). With world size > 1 and no DDP module, the
optimizer's parameters are fingerprinted instead (nothing averages their gradients, so they must be
compared), and the buffers of the modules that hold them when the iteration ends (FSDP2 shards parameters,
never buffers: every rank keeps its own copy). Every optimizer's step count (its step() calls and the
``state['step']`` it keeps per parameter) is recorded when the iteration ends: it must be equal on every rank.
An FSDP2 job's iterations are counted in its root module's forwards (every rank all-gathers in them), as a DDP
job's are in DDP's all-reduces (see _completed). After ``steps`` iterations the fingerprints stop; the data recorder goes on (indices only)
until every shuffling training loader began its second epoch, at most ``data_steps`` more steps, so a
missing ``set_epoch`` shows at default settings. Then every rank raises :class:`CheckSyncStop` (a clean
``SystemExit(0)``) from the same step, agreed on check-sync's own gloo group (the most steps any rank still
needs, exchanged at ``steps`` and again at the step it named), so none waits on another.
Every hook runs under a :class:`~ddpdoctor.probes.guard.Guard`: a failure is noted and switches the
fingerprints off; the stop and its exchanges stay, identical on every rank."""

from __future__ import annotations

import math
import time
from datetime import timedelta
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel

from ddpdoctor.probes.config import ProbeOptions
from ddpdoctor.probes.fingerprints import WatchedModule, fingerprints
from ddpdoctor.probes.guard import NOTES_FILE, Guard, ProbeNotes
from ddpdoctor.probes.records import FingerprintRow, OutsideParam, RankStatusDoc, SyncDoc
from ddpdoctor.probes.sampler import SamplerProbe
from ddpdoctor.rundir.layout import RunDir, write_json

GATHER_TIMEOUT_S = 120  # the separate gloo group's timeout: a missing rank delays the stop, never hangs it
MAX_CHECKED_STEPS = 200  # with --steps 0 (run to the end) the first 200 steps are checked, so sync.json stays small
DATA_STEPS = 500  # default: steps past --steps the data recorder may run on to see a shuffling loader's 2nd epoch


class CheckSyncStop(SystemExit):
    """Ends the script on every rank after the requested number of checked steps."""

    def __init__(self, step: int) -> None:
        super().__init__(0)
        self.step = step


class SyncProbe:
    def __init__(self, run: RunDir, rank: int, world_size: int, options: ProbeOptions, tracker: Any) -> None:
        self.run = run
        self.rank = rank
        self.world_size = world_size
        self.tracker = tracker
        self.stop_after = int(options.get("steps", 5) or 0)  # 0: never stop (benchmarks, API users)
        self.data_steps = int(options.get("data_steps", DATA_STEPS) or 0)
        self.equivalence = bool(options.get("equivalence", False))
        self.notes = ProbeNotes(run.rank_file(rank, NOTES_FILE))
        self.guard = Guard("check-sync fingerprint", self.notes, lambda: tracker.step)
        self.modules: list[WatchedModule] = []
        self.grads: list[FingerprintRow] = []
        self.params: list[FingerprintRow] = []
        self.buffers: list[FingerprintRow] = []
        self.optimizer_steps: list[FingerprintRow] = []  # per optimizer: [step() calls], [min, max state['step']]
        self._optimizers: list[Any] = []  # the optimizers whose step() ran, in the order first seen
        self._step_calls: list[int] = []
        self._fsdp_root: Any = None  # FSDP2's root module (the first fully_shard module to run a forward)
        self._fsdp_forwards = 0  # its forwards under grad with gradient sync on: the job's iteration count
        self._fsdp_in_iteration = False
        self.optimizer_params_outside_ddp: list[OutsideParam] = []
        self.sampler = SamplerProbe(Guard("check-sync data", self.notes, lambda: tracker.step))
        self.stopped_at: int | None = None
        self.stop_reason: str | None = None
        self.check_seconds = 0.0
        self._grads_done_step = -1
        self._handles: list[Any] = []
        self._orig_ddp_init: Any = None
        self._equiv: Any = None
        self._group: Any = None
        self._next_check = 0  # data phase: the step at which the ranks agree again on whether to go on
        self._seen_modules: dict[int, Any] | None = {}  # modules that ran a forward before the first optimizer step
        self.closure_steps = 0

    # -- installation ---------------------------------------------------------------------------------
    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        orig = DistributedDataParallel.__init__
        probe = self

        def __init__(ddp: Any, module: Any, *args: Any, **kwargs: Any) -> None:
            orig(ddp, module, *args, **kwargs)
            probe.guard.call("DistributedDataParallel's constructor", probe._watch, ddp)

        self._orig_ddp_init = orig
        DistributedDataParallel.__init__ = __init__  # type: ignore[method-assign,assignment]
        self._handles.append(register_optimizer_step_pre_hook(self._optimizer_hook))
        if self.world_size > 1:
            # Names for the optimizer's parameters should no DDP module appear (dropped at the first step).
            self._seen_handle = register_module_forward_pre_hook(self._on_any_forward)
            self._handles.append(self._seen_handle)
        self.sampler.install()
        if self.equivalence:
            from ddpdoctor.probes.equivalence import EquivalenceCheck

            self._equiv = EquivalenceCheck(self)

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._orig_ddp_init is not None:
            DistributedDataParallel.__init__ = self._orig_ddp_init  # type: ignore[method-assign]
            self._orig_ddp_init = None
        self.sampler.uninstall()
        # Let go of check-sync's own gloo group now, in a live interpreter: held by this probe it was destroyed in
        # the interpreter's teardown, after the script's destroy_process_group(), where gloo's threads may abort
        # the process ("terminate called without an active exception") after the rank finished its work.
        self._group = None

    def _watch(self, ddp: Any) -> None:
        mod = WatchedModule(len(self.modules), ddp)
        from ddpdoctor.probes.ddp_recorder import _built_by

        mod.built_by = _built_by()  # the framework that built DDP, for advice in its terms (findings/framework_advice)
        self.modules.append(mod)
        def ddp_pre(m: Any, args: Any, kwargs: Any) -> None:  # returns None: the forward's inputs stay as they are
            self._count_forward(mod)
            self.guard.call("the DDP module's forward", self._on_ddp_forward, mod, args, kwargs)

        ddp.register_forward_pre_hook(ddp_pre, with_kwargs=True)
        for p in mod.params:
            if not hasattr(p, "placements"):  # plain tensors: a hook before accumulation sees this rank's own gradient
                self._handles.append(p.register_hook(
                    lambda g, mod=mod: self.guard.call("a gradient hook", self._on_local_grad, mod, g)))
        ddp.module.register_forward_pre_hook(
            lambda m, args: self.guard.call("the wrapped module's forward", self._on_inner_forward, mod))
        if self._equiv is not None:
            ddp.register_forward_hook(lambda m, args, out: self._equiv.on_output(mod, out))

    # -- the job's own iteration count -------------------------------------------------------------------
    # Steps are counted in DDP's gradient all-reduces (synced forwards under grad), not in optimizer steps: a rank
    # that skips optimizer.step() (a rank-local "gradient norm too large" decision) still joins every all-reduce, so
    # this count is the same on every rank at the same point of the job, and check-sync's own collectives (the stop
    # agreement, the gather) can never wait against the job's. Without DDP: the tracker's optimizer steps.
    # FSDP2 (no DDP module): the root module's forwards under grad, which all-gather on every rank, likewise.
    def _completed(self) -> int:
        """Iterations ended so far (at a step end, or before a synced forward: the previous iteration is over)."""
        n = max((m.total_synced for m in self.modules if m.ddp is not None), default=0)
        return n if n else self._fsdp_forwards or int(self.tracker.step)

    def _index(self) -> int:
        """The (0-based) iteration running now, for the fingerprint rows."""
        ddp = [m for m in self.modules if m.ddp is not None]
        n = max((m.total_synced for m in ddp), default=0)
        if not n:
            if self._fsdp_forwards:
                return self._fsdp_forwards - 1 if self._fsdp_in_iteration else self._fsdp_forwards
            return int(self.tracker.step)
        return n - 1 if any(m.last_forward_synced for m in ddp) else n

    def _count_forward(self, mod: WatchedModule) -> None:
        """Before a DDP forward, outside the fingerprints' guard (the stop must happen on every rank): count the
        synced ones, and stop here if this rank skipped the optimizer step at which its peers stop."""
        try:
            if not torch.is_grad_enabled() or not bool(mod.ddp.require_backward_grad_sync):
                return
        except Exception:  # noqa: BLE001 - private attribute: then this module is not counted
            return
        self._stop_check(self._completed())
        mod.total_synced += 1

    def _on_fsdp_root_forward(self, module: Any, args: Any) -> None:
        """Before FSDP2's root forward, outside the fingerprints' guard (like _count_forward): count the iterations
        that reduce gradients, and stop here if this rank skipped the optimizer step at which its peers stop."""
        if not torch.is_grad_enabled() or not _fsdp_reduces_grads(module):
            return
        if self._fsdp_in_iteration:
            # the last iteration ended without an optimizer step on this rank: its step counts say so at that step
            self.guard.call("the optimizer's step count", self._record_step_counts, self._fsdp_forwards - 1)
        self._stop_check(self._completed())
        self._fsdp_forwards += 1
        self._fsdp_in_iteration = True

    def _checking(self, step: int) -> bool:
        """Fingerprints are taken at this (0-based) iteration: inside the gradient-check window."""
        return step < (self.stop_after or MAX_CHECKED_STEPS) and step < MAX_CHECKED_STEPS

    # -- hooks ------------------------------------------------------------------------------------------
    def _on_any_forward(self, module: Any, args: Any) -> None:
        seen = self._seen_modules
        if seen is not None and len(seen) < 10_000 and self.guard.enabled:
            seen.setdefault(id(module), module)
        if self._fsdp_root is None and not self.modules and _is_fsdp2(module):
            # FSDP2's root is the first fully_shard module to run a forward (its lazy init says so). This call's
            # hooks are already chosen: count it here, the module's own hook counts the next ones.
            self._fsdp_root = module
            self._handles.append(module.register_forward_pre_hook(self._on_fsdp_root_forward))
            self._on_fsdp_root_forward(module, args)

    def _on_ddp_forward(self, mod: WatchedModule, args: Any, kwargs: Any) -> None:
        ddp = mod.ddp
        if not torch.is_grad_enabled():
            return  # evaluation: DDP reduces nothing for it
        mod.used = True
        synced = bool(ddp.require_backward_grad_sync)
        mod.last_forward_synced = synced
        if synced:
            mod.synced_forwards += 1
        else:
            mod.unsynced_forwards += 1
        # DDP broadcasts buffers before this forward only under these conditions (its own test).
        try:
            mod.buffers_synced_now = bool(ddp._check_sync_bufs_pre_fwd())
        except Exception:  # noqa: BLE001 - private API
            mod.buffers_synced_now = None
        if self._equiv is not None:
            self._equiv.on_forward(mod, args, kwargs)

    def _on_inner_forward(self, mod: WatchedModule) -> None:
        step = self._index()
        if not self._checking(step) or not torch.is_grad_enabled() or mod.buffers_done_step == step or not mod.buffer_names:
            return
        mod.buffers_done_step = step
        t0 = time.perf_counter()
        tensors = [b for _, b in mod.ddp.module.named_buffers()]
        self.buffers.append({
            "step": step, "module": mod.index, "synced_by_ddp": mod.buffers_synced_now,
            "fp": fingerprints(tensors),
        })
        self.check_seconds += time.perf_counter() - t0

    def _on_local_grad(self, mod: WatchedModule, grad: Any) -> None:
        """This rank's own gradient, before DDP averages it into every rank: its sum (NaN or inf when any element
        is), kept on the device and read at the optimizer step, so a rank whose loss went NaN can be named."""
        if self._checking(self._index()) and len(mod.local_sums) < 100_000:
            mod.local_sums.append(grad.detach().sum())

    def _optimizer_hook(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        # optimizer.step(closure) (Lightning, LBFGS): forward and backward run inside the step, after this hook.
        # The closure is handed back wrapped, so the gradients are read as soon as it has made them (a pre hook may
        # return new args and kwargs); what the closure returns is returned unchanged.
        # (torch passes the step's own args, the optimizer first: step(self, closure))
        self.guard.call("the optimizer's step count", self._count_step, optimizer)
        lead = 1 if args and args[0] is optimizer else 0
        in_kwargs = isinstance(kwargs, dict) and callable(kwargs.get("closure"))
        closure = kwargs["closure"] if in_kwargs else (
            args[lead] if len(args) > lead and callable(args[lead]) else None)
        if closure is None:
            self.guard.call("the optimizer's step", self._on_optimizer_pre, optimizer)
            new = None
        else:
            self.closure_steps += 1
            self.guard.call("the optimizer's step", self._on_optimizer_pre, optimizer, True)
            step = self._index()

            def closure_then_grads() -> Any:
                out = closure()
                self.guard.call("the optimizer's step (closure)", self._record_grads, optimizer, step)
                return out

            new = ((args, {**kwargs, "closure": closure_then_grads}) if in_kwargs
                   else ((*args[:lead], closure_then_grads, *args[lead + 1:]), kwargs))
        if self._equiv is not None:
            # Outside the fingerprints' guard: its exchange must happen on every rank, failed or not.
            self._equiv.on_optimizer_pre(self.tracker.step)
        return new

    def _count_step(self, optimizer: Any) -> None:
        for i, known in enumerate(self._optimizers):
            if known is optimizer:
                self._step_calls[i] += 1
                return
        if len(self._optimizers) < 64:
            self._optimizers.append(optimizer)
            self._step_calls.append(1)

    def _on_optimizer_pre(self, optimizer: Any, closure: bool = False) -> None:
        if self._seen_modules is not None:
            self._watch_plain(optimizer)
        if not closure:
            self._record_grads(optimizer, self._index())

    def _record_grads(self, optimizer: Any, step: int) -> None:
        if self._grads_done_step == step or not self._checking(step):
            return  # a second optimizer in the same iteration, or past the checked steps
        self._grads_done_step = step
        t0 = time.perf_counter()
        for mod in self.modules:
            if mod.ddp is None:
                mod.used = True
                continue  # without DDP gradients may differ by design; the parameters may not
            if mod.synced_forwards == 0 and mod.unsynced_forwards == 0:
                continue  # not used in this iteration
            self.grads.append({
                "step": step, "module": mod.index,
                "synced_forwards": mod.synced_forwards, "unsynced_forwards": mod.unsynced_forwards,
                "reduced": bool(mod.last_forward_synced),
                "local_nonfinite": _any_nonfinite(mod.local_sums),
                "fp": fingerprints([p.grad for p in mod.params]),
            })
            mod.local_sums = []
        if step == 0 and any(m.ddp is not None for m in self.modules):
            self._note_params_outside_ddp(optimizer)
        self.check_seconds += time.perf_counter() - t0

    def _watch_plain(self, optimizer: Any) -> None:
        """At the first optimizer step: without any DDP module in a multi-rank job, watch the optimizer's
        parameters, named after the largest module that ran a forward and holds them."""
        seen, self._seen_modules = self._seen_modules or {}, None
        handle = getattr(self, "_seen_handle", None)
        if handle is not None:
            handle.remove()
        if self.modules or self.world_size < 2:
            return
        names: dict[int, str] = {}
        owners = sorted(seen.values(), key=lambda m: -sum(1 for _ in m.parameters()))
        for m in owners:
            for n, p in m.named_parameters():
                names.setdefault(id(p), n)
        plain = [(names.get(id(p), f"param_groups[{g}][{i}]"), p)
                 for g, group in enumerate(optimizer.param_groups)
                 for i, p in enumerate(group["params"]) if p.requires_grad]
        if plain:
            self.modules.append(WatchedModule(0, None, plain, _owned_buffers(owners, {id(p) for _, p in plain})))

    def _note_params_outside_ddp(self, optimizer: Any) -> None:
        inside = {id(p) for mod in self.modules if mod.ddp is not None for p in mod.ddp.module.parameters()}
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                if id(p) not in inside and p.requires_grad:
                    self.optimizer_params_outside_ddp.append(
                        {"name": f"{type(optimizer).__name__}.param_groups[{g}][{i}]", "shape": list(p.shape)}
                    )

    def _record_params(self, done: int) -> None:
        t0 = time.perf_counter()
        self._record_step_counts(done)
        for mod in self.modules:
            if mod.used and self._checking(done):
                self.params.append({"step": done, "module": mod.index, "fp": fingerprints(list(mod.params))})
                if mod.ddp is None and mod.buffers:  # without DDP: the buffers as the iteration left them
                    self.buffers.append({"step": done, "module": mod.index, "synced_by_ddp": False,
                                         "fp": fingerprints(list(mod.buffers))})
            mod.used = False
            mod.synced_forwards = mod.unsynced_forwards = 0
            mod.last_forward_synced = None
            mod.local_sums = []
        self.check_seconds += time.perf_counter() - t0

    def _record_step_counts(self, done: int) -> None:
        self._fsdp_in_iteration = False
        if self._checking(done):
            for i, opt in enumerate(self._optimizers):
                self.optimizer_steps.append({"step": done, "module": i, "fp": fingerprints(_step_counts(
                    opt, self._step_calls[i]))})

    def on_step(self, step: int) -> None:
        """Step listener: iteration ``step - 1`` ended (its optimizer stepped)."""
        self.sampler.on_step(step)
        done = self._completed()
        self.guard.call("the end of a step", self._record_params, done - 1)
        self._stop_check(done)

    def _stop_check(self, step: int) -> None:
        """``step`` iterations ended (in the job's own count, see _completed): stop here, or agree to go on."""
        if not self.stop_after or step < self.stop_after or step < self._next_check:
            return  # inside the checked steps, or between two agreements of the data phase (no communication)
        # Past the checked steps: stop now, or once every shuffling training loader began its second epoch.
        # Every rank must stop at the same step: they agree on the steps still needed (the most any rank
        # needs) and exchange again only at that step, so the data phase adds no per-step communication.
        cap = self.stop_after + self.data_steps
        local = 0 if step >= cap else self._steps_needed()
        needed = self._agree(local)
        if needed > 0 and step < cap:
            self._next_check = min(step + needed, cap)
            return
        self.stopped_at = step
        self.stop_reason = "data" if step > self.stop_after else "steps"
        self._write()
        self._gather()
        raise CheckSyncStop(step)

    def _steps_needed(self) -> int:
        """This rank's steps still needed for a second epoch of every shuffling training loader (0: none)."""
        result = self.sampler.guard.call("estimating the steps to a second epoch", self.sampler.steps_to_second_epoch)
        return int(result or 0)

    def _agree(self, steps_needed: int) -> int:
        """The most steps any rank still needs (every rank gets the same answer); 0 when alone or on failure."""
        import torch.distributed as dist

        if not self.data_steps:
            return 0
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return steps_needed if self.world_size < 2 else 0
        try:
            flag = torch.tensor([steps_needed], dtype=torch.int64)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group())
            return int(flag.item())
        except Exception as exc:  # noqa: BLE001 - then stop here, as before the data recorder ran on
            self.notes.add("check-sync stop", "agreeing on the stop step", exc, self.tracker.step)
            self.data_steps = 0
            return 0

    def group(self) -> Any:
        """check-sync's own gloo group, created on first use (every rank reaches the same call at the same iteration
        of the job: the steps are counted in DDP's own all-reduces, see _completed)."""
        import torch.distributed as dist

        if self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=GATHER_TIMEOUT_S))
        return self._group

    def _gather(self) -> None:
        """Every rank stops at the same step: gather the records on rank 0 too, for run directories that
        are not shared between nodes (rank 0 writes ranks/rank0/sync-all.json; analysis reads it for ranks
        whose own files are absent)."""
        import torch.distributed as dist

        try:
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return
            payload = {"sync": self.record(), "data": {"rank": self.rank, **self.sampler.data()}}
            gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            dist.gather_object(payload, gathered, dst=0, group=self.group())
            if gathered is not None:
                all_ranks = {str(p["sync"]["rank"]): p for p in gathered if p}
                _write_compact(self.run.rank_file(self.rank, "sync-all.json"), all_ranks)
        except Exception:  # noqa: BLE001 - the per-rank files are written already
            pass

    # -- output -------------------------------------------------------------------------------------------
    def _write(self) -> None:
        try:
            _write_compact(self.run.rank_file(self.rank, "sync.json"), self.record())
            _write_compact(self.run.rank_file(self.rank, "data.json"), {"rank": self.rank, **self.sampler.data()})
        except Exception as exc:  # noqa: BLE001 - a full disk or an odd value: the job still ends as it would
            self.notes.add("check-sync", "writing sync.json and data.json", exc, self.tracker.step)

    def record(self) -> SyncDoc:
        def clean(rows: list[FingerprintRow]) -> list[FingerprintRow]:
            # JSON has no NaN/inf: keep them as strings so the comparison still sees them.
            for row in rows:
                row["fp"] = [None if fp is None else [v if math.isfinite(cast(float, v)) else repr(v) for v in fp]
                             for fp in row["fp"]]
            return rows

        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "stop_after": self.stop_after,
            "data_steps": self.data_steps,
            "stopped_at": self.stopped_at,
            "stop_reason": self.stop_reason,
            # iterations (in the job's own count, see _completed) when check-sync stopped it, else optimizer steps
            "steps_completed": self.stopped_at if self.stopped_at is not None else self.tracker.step,
            "check_seconds": round(self.check_seconds, 6),
            "probe_failed": not self.guard.enabled,
            "modules": [m.describe() for m in self.modules],
            "optimizer_params_outside_ddp": self.optimizer_params_outside_ddp,
            "closure_steps": self.closure_steps,
            "grads": clean([r.copy() for r in self.grads]),
            "params": clean([r.copy() for r in self.params]),
            "buffers": clean([r.copy() for r in self.buffers]),
            "optimizers": [type(o).__name__ for o in self._optimizers],
            "optimizer_steps": clean([r.copy() for r in self.optimizer_steps]),
            "equivalence": self._equiv.result if self._equiv is not None else None,
        }

    def finish(self, status: RankStatusDoc) -> None:
        if self.stopped_at is not None:
            status["stopped_by"] = f"check-sync after {self.stopped_at} steps"
        else:
            self._write()
        self.uninstall()


def _is_fsdp2(module: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6: FSDP2 lived under _composable
        try:
            from torch.distributed._composable.fsdp import FSDPModule
        except ImportError:
            return False
    return isinstance(module, FSDPModule)


def _fsdp_reduces_grads(root: Any) -> bool:
    """False while FSDP2 accumulates gradients without reducing them (set_requires_gradient_sync(False)), like
    DDP's no_sync: such a forward is no iteration of the job. Private state: on any doubt, True."""
    try:
        state = root._get_fsdp_state()
        states = state._state_ctx.all_states or [state]
        return all(g.reduce_grads for s in states for g in s._fsdp_param_groups)
    except Exception:  # noqa: BLE001
        return True


def _step_counts(optimizer: Any, calls: int) -> list[torch.Tensor]:
    """What must be equal on every rank about an optimizer: its step() calls, and the smallest and largest
    ``state['step']`` over its parameters (Adam's family keeps one per parameter; [] when it keeps none). A fused or
    capturable optimizer keeps them on the device: one reduction and one host copy per device, not one per tensor."""
    numbers: list[float] = []
    by_device: dict[Any, list[torch.Tensor]] = {}
    for st in optimizer.state.values():
        v = st.get("step") if isinstance(st, dict) else None
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            by_device.setdefault(v.device, []).append(v.detach().reshape(()).double())
        elif isinstance(v, (int, float)):
            numbers.append(float(v))
    for values in by_device.values():
        stacked = torch.stack(values)
        numbers.extend(torch.stack([stacked.min(), stacked.max()]).tolist())
    state = (torch.tensor([min(numbers), max(numbers)], dtype=torch.float64) if numbers
             else torch.zeros(0, dtype=torch.float64))
    return [torch.tensor([float(calls)], dtype=torch.float64), state]


def _owned_buffers(owners: list[Any], params: set[int]) -> list[tuple[str, Any, bool]]:
    """The buffers of the outermost modules that ran a forward and hold any of ``params`` (the model, whatever
    wraps it), named as in the model, each once, with whether a BatchNorm owns it. ``owners``: largest (most
    parameters) first."""
    covered: set[int] = set()
    out: list[tuple[str, Any, bool]] = []
    seen: set[int] = set()
    for m in owners:
        if id(m) in covered:
            continue
        covered.update(id(x) for x in m.modules())
        if not any(id(p) in params for p in m.parameters()):
            continue
        for mn, sub in m.named_modules():
            bn = isinstance(sub, torch.nn.modules.batchnorm._BatchNorm)
            for name, b in sub.named_buffers(recurse=False):
                if b is not None and id(b) not in seen and len(out) < 100_000:
                    seen.add(id(b))
                    out.append((f"{mn}.{name}" if mn else name, b, bn))
    return out


def _any_nonfinite(sums: list[Any]) -> bool:
    """Any of these 0-d tensors NaN or inf: one host transfer per device."""
    by_device: dict[Any, list[Any]] = {}
    for s in sums:
        by_device.setdefault(s.device, []).append(s.float())
    return any(not bool(torch.isfinite(torch.stack(v)).all()) for v in by_device.values())


def _write_compact(path: Any, data: Any) -> None:
    """Like rundir.write_json (atomic, versioned), without indentation: json's C encoder, several times faster
    on long lists of numbers, which is what these files are."""
    write_json(path, data, compact=True)


def install_check_sync(run: RunDir, rank: int, world_size: int, options: ProbeOptions, tracker: Any) -> SyncProbe:
    """What the bootstrap calls in check-sync mode: the probe, installed and listening to step ends."""
    probe = SyncProbe(run, rank, world_size, options, tracker)
    probe.install()
    tracker.add_listener(probe.on_step)
    return probe

"""A per-step fingerprint of what this rank did, compared job-wide by the monitor (job/divergence.py), so a rank
that goes its own way is named at the step it happens (issue 38; docs/hangs.md#divergence).

The record of an iteration is taken when its first optimizer step is about to run (torch.optim's global pre hook:
everything that could reach the weights is known then), or at the iteration's end when no optimizer step ran (a
GradScaler-skipped step, an explicit ``ddpdoctor.step()``). It holds:

- ``colls``: how many collectives the default group enqueued since the last record (the Flight Recorder's status,
  ~5 us: every caller, DDP's reducer and FSDP2 included). Subgroups are not compared: which ranks belong to which
  differs by design.
- ``ops``: a rolling CRC of (op, sizes, dtype, reduce op) of the collectives the public ``torch.distributed``
  wrappers saw (probes/heartbeat.py); 0 when none.
- ``opt``: 1 when the record was taken at an optimizer step, 0 when the iteration ended without one.
- ``loss``: 1 when every loss ``backward()`` was called on was finite, 0 when one was not, -1 when none was seen or
  reading it would cost a device sync (a CUDA loss: it goes out later as a ``["loss", step, finite]`` event, below).
- ``graphs``: torch._dynamo's count of compiled graphs, once the script imported torch._dynamo (else -1).
- ``epoch``, ``dry``: the training DataLoader's epoch (0-based, -1 without one) and whether it ran dry
  (StopIteration) since the last record (probes/data_position.py).
- ``batches``, ``left``: the batches it consumed in this epoch and has left (-1: no length). Not in the key: ranks
  whose shards differ in length (a last uneven batch under ``Join``) differ there by design; the verdict shows them.
- ``recompiles``, ``breaks``: torch.compile's recompiles and graph breaks so far (probes/compile_events.py). Not in
  the key: ``graphs`` moves with them.
- an optional last element, a dict, only in a step that needs it: ``why`` (a step where torch.compile compiled: the
  guard that failed, the graph break's message) and ``calls`` (a step whose ``ops`` differs from the previous
  record's: its first MAX_CALLS public collectives as "op|sizes|dtype|reduce op"), what a verdict quotes.

A **grad-set event** ``["grads", step, count, total, crc(, {"off": names, "on": names})]`` goes out at the first
``backward()`` of each step (before DDP's or FSDP2's gradient collectives can block): of the ``total`` parameters
DDP and FSDP2 manage, how many require grad (``count``) and a CRC of which. A rank that froze a layer alone (the
ezpz#242 shape) builds other gradient buckets; the others then wait inside that step's backward and never take its
record, so this event is what the job compares there. The names of the parameters whose flag changed since the
rank's previous event ride along only in a step where it changed. Cost: one ``requires_grad`` read a managed
parameter a step (C speed, ``bytes(map(...))``; benchmarks/collective_source_cost.py measures it).

A **gradient-norm event** ``["gnorm", step, finite]`` (1 finite, 0 NaN/inf) goes out for a step in which the script
computed its gradient norm anyway: the value ``torch.nn.utils.clip_grad_norm_`` (and the deprecated
``clip_grad_norm``, which calls it) or ``get_total_norm`` returned, wrapped here; a DTensor norm (FSDP2) is read
through its local part (``to_local()``: no collective; torch 2.13's clip_grad_norm_ returns it Replicate()d, the
same on every rank). A norm over gradients DDP or FSDP2 averaged is the same on every rank, so it differs only where
a rank's norm covers gradients that are not averaged (a parameter outside DDP, a norm taken before a manual
all-reduce); a NaN loss is the ``loss`` field's. A CPU norm is read at once (a few us:
benchmarks/collective_source_cost.py); a CUDA norm is never read on the training thread (that would sync the device): a non-blocking copy to pinned host memory and a CUDA event are queued, and the heartbeat thread reads the
value once the event has completed (``event.query()``, no sync), so its event comes a tick or more after the step.
Not read while torch.compile traces (no graph break). The event of a step goes out after the step's record was taken
(in stop mode with it, before it: the judge sees it first).

A record is a short list ``[step, key, colls, ops, opt, loss, graphs, epoch, dry, batches, left, recompiles,
breaks(, extra)]`` (~55 bytes of JSON); ``key`` is a CRC of the compared fields, what the job compares. Records wait in a deque the heartbeat thread drains every tick (0.2 s). After them may come the
training loader's dry event ``["dry", step, ms]`` (probes/data_position.py), which the job judges at once.

``--on-divergence stop`` ($DDPDOCTOR_ON_DIVERGENCE=stop): the record is sent at once and the optimizer's pre-hook
holds until the monitor says every rank agreed on that step (``fp-ok``) or that they did not
(``divergence-stop``: it raises DivergenceStopped, so nothing from the divergent step reaches the weights). A hold
that gets no answer within HOLD_S (a peer that never reaches its optimizer step: it waits in a collective this
rank will only join after its own step) lets the step go on: the verdict then stops the job one step later."""

from __future__ import annotations

import functools
import math
import operator
import os
import threading
import weakref
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from ddpdoctor.job.divergence import MODE_ENV, RecordExtra, record_key
from ddpdoctor.probes.compile_events import CompileEvents
from ddpdoctor.probes.data_position import DataPosition

MAX_PENDING = 4096  # records not yet drained (a heartbeat thread that cannot send): the oldest are dropped
# A peer that is only slower (a longer data load) costs this much protection, never an alarm. The tests raise it
# ($DDPDOCTOR_DIVERGENCE_HOLD_S) so that a loaded machine's slow monitor cannot let a held step go.
HOLD_S = 2.0
HOLD_ENV = "DDPDOCTOR_DIVERGENCE_HOLD_S"
MAX_CALLS = 8  # public collectives of a step kept to explain an ``ops`` difference
MAX_NAMES = 8  # parameters named in a grad-set event whose flag changed
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class DivergenceStopped(RuntimeError):
    """Raised in the optimizer's pre-hook once the job found ranks that diverged (--on-divergence stop)."""


class StepFingerprint:
    def __init__(self, tracker: Any, stop: bool | None = None,
                 managed: Callable[[], list[Any]] | None = None) -> None:
        self.tracker = tracker
        # The DDP modules and FSDP2 states the script built (probes/bootstrap.py): whose parameters' requires_grad
        # flags the grad-set event compares; None or [] sends none.
        self.managed = managed
        self._owners: list[weakref.ReferenceType[Any]] = []
        self._owners_key: tuple[int, ...] = ()
        self._params: list[Any] = []
        self._flags: bytes | None = None  # the last grad-set event's flags (one byte a managed parameter)
        self._grads_step = 0
        # Gradient norms the script computed: (step, finite as bool or a host tensor being filled, its CUDA event)
        self._norms: list[tuple[str, int, Any, Any]] = []  # (kind, step, finite or a host copy, its CUDA event)
        self._norms_lock = threading.Lock()  # the training thread adds, the heartbeat thread reads CUDA ones
        self._recorded = 0  # the step of the last record taken: norms of steps up to it go out
        self._norm_originals: list[tuple[Any, str, Any]] = []
        self.stop = os.environ.get(MODE_ENV) == "stop" if stop is None else stop
        self.pending: deque[list[Any]] = deque(maxlen=MAX_PENDING)
        self.stop_reason: str | None = None
        self.send: Callable[[list[list[Any]]], None] | None = None  # stop mode: the heartbeat's immediate send
        self.holds_timed_out = 0
        self.data = DataPosition(tracker)
        self.compiles = CompileEvents()
        self._ops = 0
        self._calls: list[str] = []  # this step's first MAX_CALLS public collectives, as folded into ``ops``
        self._last_ops = 0  # the previous record's ``ops``
        self._loss = -1
        self._taken = False  # this iteration's record was taken (at its first optimizer step)
        self._base: int | None = None  # the default group's last enqueued sequence number at the last record
        self._handles: list[Any] = []
        self._group: str | None = None
        self._ok_step = 0
        self._answer = threading.Condition()
        try:
            self.hold_s = float(os.environ.get(HOLD_ENV, HOLD_S))
        except ValueError:
            self.hold_s = HOLD_S

    def install(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._on_pre))
        self.tracker.add_listener(self._on_step)
        self.data.install()
        self._wrap_norms()

    def finish(self, status: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.data.uninstall()
        for mod, name, fn in reversed(self._norm_originals):
            setattr(mod, name, fn)
        self._norm_originals.clear()

    def _wrap_norms(self) -> None:
        """torch.nn.utils.clip_grad_norm_ and get_total_norm return the gradient norm: their value is read (or queued,
        on CUDA) by ``saw_grad_norm``; the script gets it unchanged."""
        import torch.nn.utils as utils
        import torch.nn.utils.clip_grad as clip_grad

        wrapped: dict[int, Any] = {}
        for mod, name in ((utils, "clip_grad_norm_"), (clip_grad, "clip_grad_norm_"), (utils, "get_total_norm")):
            fn = getattr(mod, name, None)
            if fn is None:
                continue
            if id(fn) not in wrapped:
                wrapped[id(fn)] = self._norm_wrapper(fn)
            self._norm_originals.append((mod, name, fn))
            setattr(mod, name, wrapped[id(fn)])

    def _norm_wrapper(self, fn: Any) -> Any:
        fp = self

        @functools.wraps(fn)
        def norm(*args: Any, **kwargs: Any) -> Any:
            out = fn(*args, **kwargs)
            try:
                fp.saw_grad_norm(out)
            except Exception:  # noqa: BLE001 - the script's own call is never broken by the record
                pass
            return out

        return norm

    def saw_grad_norm(self, norm: Any) -> None:
        """A gradient norm the script computed in this step: read on CPU, queued on CUDA (no device sync)."""
        if torch.compiler.is_compiling() or not isinstance(norm, torch.Tensor):
            return
        local = norm.to_local() if hasattr(norm, "to_local") else norm  # a DTensor: this rank's part, no collective
        if isinstance(local, torch.Tensor) and local.numel() == 1:
            self._late("gnorm", local.detach())

    def _late(self, kind: str, t: torch.Tensor) -> None:
        """A scalar of this step whose finiteness goes out as a ``[kind, step, finite]`` event: a CPU one read now,
        a CUDA one copied to pinned host memory without waiting, with an event the heartbeat thread polls."""
        step = self.tracker.step + 1
        if t.device.type == "cpu":
            item: tuple[str, int, Any, Any] = (kind, step, math.isfinite(float(t)), None)
        elif t.device.type == "cuda":
            host = t.to("cpu", non_blocking=True)  # into pinned memory: the copy is queued, not waited for
            event = torch.cuda.Event()
            event.record()
            item = (kind, step, host, event)
        else:
            return
        with self._norms_lock:
            if len(self._norms) < MAX_PENDING:
                self._norms.append(item)

    def _norm_events(self, upto: int) -> list[list[Any]]:
        """The late events (gradient norms; CUDA losses) of the steps up to ``upto`` whose every value is known (a
        CUDA one: its copy's event completed; a step with one still being copied waits whole, so that it goes out
        once), one per kind a step: finite only when every value of it was."""
        if not self._norms:
            return []
        with self._norms_lock:
            due = [it for it in self._norms if it[1] <= upto]
            state = {id(it): _copied(it[3]) for it in due}
            waiting = {it[:2] for it in due if state[id(it)] == "wait"}
            self._norms = [it for it in self._norms if it[1] > upto or it[:2] in waiting]
        out: dict[tuple[str, int], int] = {}
        for it in due:
            kind, step, value, event = it
            if (kind, step) in waiting or state[id(it)] == "drop":
                continue
            ok = math.isfinite(float(value)) if event is not None else bool(value)
            out[kind, step] = out.get((kind, step), 1) & int(ok)
        return [[kind, st, v] for (kind, st), v in sorted(out.items(), key=lambda kv: (kv[0][1], kv[0][0]))]

    # -- the training thread -------------------------------------------------------------------------------
    def saw_collective(self, op: str, sizes: Any, args: Any, kwargs: Any) -> None:
        """A public torch.distributed call (the heartbeat's wrapper): folded into this step's ``ops``."""
        t = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dtype = str(t.dtype) if t is not None else ""
        red = kwargs.get("op")
        if red is None and op in ("all_reduce", "reduce") and len(args) > 1 and not isinstance(args[1], int):
            red = args[1]
        desc = f"{op}|{sizes}|{dtype}|{red}"
        self._ops = zlib.crc32(desc.encode(), self._ops)
        if len(self._calls) < MAX_CALLS:
            self._calls.append(desc)

    def saw_backward(self, tensor: Any) -> None:
        """``tensor.backward()`` (the heartbeat's outer backward wrapper): the step's grad-set event at its first
        backward; a CPU scalar loss is read (~1 us), a CUDA one queued for a late ``loss`` event."""
        if self.managed is not None and self._grads_step != self.tracker.step + 1:
            self._grads_step = self.tracker.step + 1
            try:
                self._grad_set(self._grads_step)
            except Exception:  # noqa: BLE001 - a module torch changed under us: no event, never a broken backward
                self.managed = None
        if self._loss == 0 or not isinstance(tensor, torch.Tensor) or tensor.numel() != 1:
            return
        if tensor.device.type == "cuda":  # never read here (a device sync): a late "loss" event, once copied
            if not torch.compiler.is_compiling():
                self._late("loss", tensor.detach())
            return
        if tensor.device.type != "cpu":
            return
        try:
            self._loss = 1 if math.isfinite(float(tensor.detach())) else 0
        except (RuntimeError, ValueError, OverflowError):
            return

    def _grad_set(self, step: int) -> None:
        objs = self.managed() if self.managed is not None else []
        key = tuple(map(id, objs))
        if key != self._owners_key or any(r() is None for r in self._owners):  # a model built or freed: found again
            self._owners_key = key
            self._owners = [weakref.ref(o) for o in objs]
            self._params = [p for o in objs for _, p in _named_params(o)]
            self._flags = None
        if not self._params:
            return
        flags = bytes(map(_REQUIRES_GRAD, self._params))
        ev: list[Any] = ["grads", step, flags.count(1), len(flags), zlib.crc32(flags)]
        if self._flags is not None and flags != self._flags:
            ev.append(self._changed(self._flags, flags))
        self._flags = flags
        self.pending.append(ev)

    def _changed(self, before: bytes, now: bytes) -> dict[str, list[str]]:
        """The managed parameters whose flag changed (first MAX_NAMES each way), by name: only in a step where one
        did, so the names are looked up then."""
        names = {id(p): n for o in (r() for r in self._owners) if o is not None for n, p in _named_params(o)}
        out: dict[str, list[str]] = {"off": [], "on": []}
        if len(before) != len(now):
            return out
        for i, (a, b) in enumerate(zip(before, now, strict=True)):
            if a != b:
                side = out["on"] if b else out["off"]
                if len(side) < MAX_NAMES:
                    side.append(names.get(id(self._params[i]), f"#{i}"))
        return out

    def _on_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._taken:
            self._taken = True
            rec = self._record(self.tracker.step + 1, opt=1)
            norms = self._norm_events(int(rec[0]))  # before the record: in stop mode the judge sees them first
            if self.stop and self.send is not None:
                self.send([*norms, rec])
                self._hold(int(rec[0]))
            else:
                self.pending.extend(norms)
                self.pending.append(rec)
        if self.stop_reason is not None:
            raise DivergenceStopped(f"ddpdoctor --on-divergence stop: {self.stop_reason}")

    def _on_step(self, step: int) -> None:
        if not self._taken:
            rec = self._record(step, opt=0)
            self.pending.extend(self._norm_events(step))
            self.pending.append(rec)
        self._taken = False

    def _record(self, step: int, opt: int) -> list[int | str]:
        self._recorded = step
        colls = 0
        seq = self._enqueued()
        if seq is not None:
            colls = seq - self._base if self._base is not None else seq + 1
            self._base = seq
        graphs, recompiles, breaks, why = self.compiles.take()
        epoch, dry, batches, left = self.data.take()
        rec: list[int | str] = [step, record_key(colls, self._ops, opt, self._loss, graphs, epoch, dry), colls,
                                self._ops, opt, self._loss, graphs, epoch, dry, batches, left, recompiles, breaks]
        extra: RecordExtra = {}
        if why is not None:
            extra["why"] = why  # only in a step where torch.compile compiled: what made it
        if self._ops != self._last_ops:
            extra["calls"] = self._calls  # only when the step's collectives changed: what they are now
        if extra:
            rec.append(extra)  # type: ignore[arg-type]  # job/divergence.py reads it to explain a difference
        self._last_ops = self._ops
        self._ops, self._loss, self._calls = 0, -1, []
        return rec

    def _enqueued(self) -> int | None:
        from ddpdoctor.probes.collectives import default_group_name, fr_status

        if self._group is None:
            self._group = default_group_name()
            if self._group is None:
                return None
        s = fr_status().get(self._group)
        return s["enqueued"] if s is not None else None

    def _hold(self, step: int) -> None:
        with self._answer:
            if not self._answer.wait_for(lambda: self._ok_step >= step or self.stop_reason is not None,
                                        self.hold_s):
                self.holds_timed_out += 1

    # -- the heartbeat thread -------------------------------------------------------------------------------
    def agreed(self, step: int) -> None:
        """The monitor's ``fp-ok``: every rank's record of ``step`` was the same."""
        with self._answer:
            self._ok_step = max(self._ok_step, step)
            self._answer.notify_all()

    def stopped(self, reason: str) -> None:
        """The monitor's ``divergence-stop``."""
        with self._answer:
            self.stop_reason = reason
            self._answer.notify_all()

    def take(self) -> list[list[Any]]:
        from ddpdoctor.probes.steps import drain

        return drain(self.pending)

    def outgoing(self, ending: bool = False) -> list[list[Any]]:
        """What the heartbeat sends this tick as an "fp" line: the records, then the training loader's dry event if
        it is due (``ending``: the rank is ending, so at once)."""
        recs = self.take() if self.pending else []
        recs += self._norm_events(self._recorded)  # CUDA norms whose copy has completed since
        ev = self.data.dry_event(force=ending)
        if ev is not None:
            recs.append(ev)
        return recs


def _copied(event: Any) -> str:
    """A CUDA norm's copy to the host: "ready" (or a CPU norm: no event), "wait", or "drop" (a device error)."""
    if event is None:
        return "ready"
    try:
        return "ready" if event.query() else "wait"
    except RuntimeError:
        return "drop"


def _named_params(owner: Any) -> list[tuple[str, Any]]:
    """A DDP module's parameters as its reducer has them (those it ignores left out), or an FSDP2 state's sharded
    parameters, with their names."""
    mod = getattr(owner, "module", None)
    if isinstance(mod, torch.nn.Module) and hasattr(owner, "_module_parameters"):  # DistributedDataParallel
        ignored: set[str] = getattr(owner, "parameters_to_ignore", set())
        return [(n, p) for n, p in mod.named_parameters() if n not in ignored]
    groups = getattr(owner, "_fsdp_param_groups", None)
    if groups is None:
        one = getattr(owner, "_fsdp_param_group", None)
        groups = [one] if one is not None else []
    return [(str(getattr(fp, "_param_fqn", None) or i), fp.sharded_param)
            for g in groups for i, fp in enumerate(getattr(g, "fsdp_params", []))]

"""The collective ledger inside a rank: how long its training thread sat blocked in collectives each step.

Why this measure (docs/metrics.md#caused-wait): at a collective the rank that arrives last spends only the transfer
inside it, while the ranks that came early spend their wait plus the transfer. So the rank the job waits for is the
one with the least blocked time while the others' is high, and its cost per step is the others' median minus its
own: no cross-host clock, a few bytes per rank per step.

Blocked time is counted on the StepTracker's phase clock as the "collective" phase, so each step's record
(step, seconds, {phase: seconds}) carries it beside the rank's own work per phase, and overlapping waits count once
(the tracker counts nested blocking as one interval):
- a blocking Python collective (``dist.all_reduce(t)``, barrier, ...): the heartbeat's wrapper, enter to return;
- every other wait of the training thread the collective source sees (probes/collectives.py: ``work.wait()``,
  DDP's buffer broadcast, functional collectives' ``wait_tensor``), enter to return;
- DDP's gradient all-reduces, launched by the reducer from autograd hooks and waited for when backward's compute is
  done: from the moment the autograd engine runs its final callbacks (queued by this probe from a hook on the root
  of ``backward()``, so ours runs before DDP's own finalisation, which waits for the buckets) to ``backward()``'s
  return.

Which source counts a step's blocked time (docs/metrics.md#ledger-sources), chosen once, at the first step's end
after the default process group exists (DDPDOCTOR_LEDGER_SOURCE=auto|host|flight-recorder overrides):
- ``host`` (gloo, and any backend whose collectives block the calling thread): the above;
- ``flight-recorder`` (NCCL): the host does not block while DDP waits (the stream does), so the blocked time comes
  from the CUDA-event durations in torch's Flight Recorder, read by the ledger's own thread (probes/flight.py).

Each collective's own record (group, sequence number, op, sizes, enqueue time, and on NCCL its duration) comes from
the Flight Recorder (probes/flight.dump_json: ``_dump_nccl_trace_json`` for NCCL's own recorder, since torch 2.5;
``_dump_fr_trace_json`` for the generic one gloo records into natively in recent releases; on by default in 2.13),
read once at the end into RUN/ranks/rankR/ledger.json with the per-step
summaries; where a build has none, the file says why and the per-step summaries stand alone. On gloo the Flight
Recorder keeps no completion times (state "scheduled", no duration): completion is the training thread's blocked
time."""

from __future__ import annotations

import functools
import os
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from ddpdoctor.analyses.flight import decode
from ddpdoctor.probes.flight import MAX_BATCH_STEPS, FlightSource, Record, dump_json, grouped_dump, ring_size

HOST_SOURCE = "host: autograd final callback + collective wrappers"
DEVICE_SOURCE = "flight-recorder: CUDA-event durations"
SOURCE_ENV = "DDPDOCTOR_LEDGER_SOURCE"  # auto (default) | host | flight-recorder
# Until the Flight Recorder source has run on a GPU (none was lent to the round that built it), ``auto`` is the host
# source on every backend: an always-on watch must not turn on CUDA-event timing in users' NCCL jobs on the strength
# of tests on recorded dumps alone. DDPDOCTOR_LEDGER_SOURCE=flight-recorder opts in (docs/metrics.md#ledger-sources).
AUTO_USES_FLIGHT_RECORDER = False


def _wants_flight_recorder(backend: str | None = None) -> bool:
    want = os.environ.get(SOURCE_ENV, "auto")
    if want == "flight-recorder":
        return True
    return want == "auto" and AUTO_USES_FLIGHT_RECORDER and (backend is None or "nccl" in backend)
HISTORY = 2048  # per-step summaries kept for ledger.json (a few bytes each)
FR_KEEP = 4096  # Flight Recorder entries written at the end (its own ring is 2,000 by default)
VERSION = 1


class LedgerProbe:
    """Installed by RankSession (probes/bootstrap.py) in every mode; the tracker does the accounting."""

    def __init__(self, tracker: Any, rank: int, path: Path) -> None:
        self.tracker = tracker
        self.rank = rank
        self.path = path
        self.history: deque[list[Any]] = deque(maxlen=HISTORY)
        self._originals: dict[tuple[Any, str], Any] = {}
        self._depth = 0
        self._blocked = False  # inside backward, past the engine's final callback: waiting for DDP's buckets
        self._engine: Any = None
        self.source = HOST_SOURCE
        self.source_note: str | None = None  # why the source is what it is, when it is not the obvious one
        self.flight: FlightSource | None = None
        self._decided = False
        self._blind_note: str | None = None
        # The heartbeat's per-beat numbers (job/record.RankRecord.summary), when a monitor watches the job. The full
        # per-step records (phases, with "collective" = blocked) travel in the beats' ``steps``.
        self.summary: dict[str, float] | None = None

    def install(self) -> None:
        try:
            self._engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
            self._engine.queue_callback  # noqa: B018 - present since torch 1.x; without it, no DDP wait is measured
        except AttributeError:
            self._engine = None
            return
        for mod, name in ((torch.Tensor, "backward"), (torch.autograd, "backward")):
            orig = getattr(mod, name)
            self._originals[(mod, name)] = orig
            setattr(mod, name, self._wrap(orig))
        self.tracker.add_listener(self._on_step)
        if _wants_flight_recorder():
            # Read by ProcessGroupNCCL when the script creates its groups: a CUDA start event per collective, whose
            # duration the Flight Recorder then keeps. Unused by every other backend; a user's own setting stands.
            os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")

    def uninstall(self) -> None:
        for (mod, name), fn in self._originals.items():
            setattr(mod, name, fn)
        self._originals.clear()

    # -- the training thread -----------------------------------------------------------------------------
    def _wrap(self, orig: Any) -> Any:
        probe = self

        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            probe._depth += 1
            handle = probe._arm(args[0] if args else kwargs.get("tensors", kwargs.get("self"))) \
                if probe._depth == 1 else None
            try:
                return orig(*args, **kwargs)
            finally:
                probe._depth -= 1
                if handle is not None:
                    handle.remove()
                if probe._depth == 0 and probe._blocked:
                    probe._blocked = False
                    probe.tracker.collective_ended()

        return backward

    def _arm(self, root: Any) -> Any:
        """A hook on the root of backward (it runs first) that queues the engine callback marking compute's end."""
        if isinstance(root, (list, tuple)):
            root = next((t for t in root if isinstance(t, torch.Tensor)), None)
        if not isinstance(root, torch.Tensor) or root.grad_fn is None or not root.requires_grad:
            return None
        try:
            return root.register_hook(self._on_root_grad)
        except RuntimeError:
            return None

    def _on_root_grad(self, grad: Any) -> None:
        try:
            self._engine.queue_callback(self._compute_done)
        except RuntimeError:
            pass
        return None  # the gradient is not changed

    def _compute_done(self) -> None:
        # The engine ran every node of this backward; what remains is DDP's finalisation: waiting for its buckets.
        if not self._blocked and self._depth > 0:
            self._blocked = True
            self.tracker.collective_started()

    def _on_step(self, step: int) -> None:
        if self.flight is not None:
            return  # the record is held until the device's figures are in (_publish)
        rec = self.tracker.last_record
        if rec is not None:
            self.history.append([rec[0], round(rec[1], 6), {k: round(v, 6) for k, v in rec[2].items()}])
            if self.summary is not None:
                self.summary["blocked_s"] = round(rec[2].get("collective", 0.0), 6)
        if not self._decided:
            self._decide()  # from the next step on

    # -- the source ---------------------------------------------------------------------------------------
    def _decide(self) -> None:
        """Once the default group exists: NCCL's blocked time comes from the Flight Recorder (see the module)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return  # no group yet (or a job without one): the host source, asked again next step
        self._decided = True
        backend = str(dist.get_backend())
        if not _wants_flight_recorder(backend):
            if "nccl" in backend and os.environ.get(SOURCE_ENV, "auto") == "auto":
                self.source_note = self._blind_note = (
                    "NCCL with the host source: a peer's lateness that DDP waits for on the stream is not seen "
                    "(DDPDOCTOR_LEDGER_SOURCE=flight-recorder reads CUDA-event durations; opt-in, not yet run on a GPU)")
            return
        if ring_size() == 0:
            self.source_note = self._blind_note = ("the Flight Recorder is off (TORCH_FR_BUFFER_SIZE=0): the host "
                                                   "source, which does not see NCCL's waits")
            return
        if os.environ.get("TORCH_NCCL_ENABLE_TIMING", "1") != "0":  # a user's own "0" stands: steps go out as gaps
            try:  # groups made before the env default took effect
                dist.distributed_c10d._get_default_group()._enable_collectives_timing()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - a backend without timing: its steps go out as gaps, ledger.json says why
                pass
        self.source = DEVICE_SOURCE
        self.source_note = f"default group backend {backend}"
        self.flight = FlightSource(self._publish, dump=grouped_dump(backend))
        # A read publishes up to MAX_BATCH_STEPS steps at once: room for them until the heartbeat takes them.
        self.tracker.recent = deque(self.tracker.recent, maxlen=max(self.tracker.recent.maxlen or 0,
                                                                    2 * MAX_BATCH_STEPS))
        self.tracker.hold = self.flight.hold
        self.flight.start()

    def _publish(self, rec: Record) -> None:
        """The ledger's thread: a held step with its device figures, to where the heartbeat takes them."""
        self.tracker.recent.append(rec)
        self.history.append([rec[0], round(rec[1], 6), {k: round(v, 6) for k, v in rec[2].items()}])
        if self.summary is not None and "collective" in rec[2]:
            self.summary["blocked_s"] = round(rec[2]["collective"], 6)

    def _stop_flight(self) -> None:
        if self.flight is not None:
            if self.tracker.hold == self.flight.hold:
                self.tracker.hold = None
            self.flight.close()  # the steps still held go out now, for the heartbeat's last beat

    # -- the end ------------------------------------------------------------------------------------------
    def annotate(self, status: dict[str, Any]) -> None:
        self._stop_flight()
        status["ledger"] = {"source": self.source, "blind": self.blind()}

    def blind(self) -> str | None:
        """Why this rank's blocked time could not be measured on NCCL (None when it could, or off NCCL)."""
        if self._blind_note is not None:
            return self._blind_note
        f = self.flight
        if f is not None and f.published["gap"] and not f.published["device"]:
            return f.last_gap or f.error
        return None

    def finish(self, status: dict[str, Any]) -> None:
        from ddpdoctor.rundir.layout import write_json

        self.uninstall()
        self._stop_flight()
        data = {"version": VERSION, "rank": self.rank, "source": self.source, "source_note": self.source_note,
                "steps": list(self.history), **flight_recorder_entries()}
        if self.flight is not None:
            data["flight"] = self.flight.summary()
        try:
            write_json(self.path, data)
        except OSError:
            pass  # a full disk must not change how the user's job ends


def flight_recorder_entries(keep: int = FR_KEEP) -> dict[str, Any]:
    """The collectives torch's Flight Recorder holds: group, seq, op, sizes, enqueue time (and on NCCL with timing
    the duration) per entry, in a compact list; or the reason there are none."""
    try:
        entries = decode(dump_json())
    except Exception as exc:  # noqa: BLE001 - not built in, not initialised: the per-step summaries stand alone
        return {"collectives_source": None, "collectives_error": repr(exc)[:300]}
    return {"collectives_source": "flight-recorder", "collectives": [c.to_json() for c in entries[-keep:]],
            "collectives_at": time.time()}

"""The collective ledger's NCCL source inside a rank: each step's time blocked in collectives taken from the CUDA
events torch's Flight Recorder keeps, read by the ledger's own thread (docs/metrics.md#ledger-sources).

Why: with NCCL the training thread does not block while DDP waits for its buckets (the stream waits), so the
host's blocked time sees none of a peer's lateness; the device's does. The step's record (step, seconds, phases)
is held back on the training thread (one deque append) until the Flight Recorder has every collective enqueued in
that step completed and timed, then published to the tracker's ``recent`` queue (what the heartbeat sends) with
``collective`` = the device seconds; the host's own blocked time moves to ``host_collective``. A step whose device
time cannot be known (timing off, the ring overwritten before it was read, a collective that never completes) is
published with the ``ledger_gap`` marker, which the caused-wait rule leaves out of its window (analyses/ledger.py).

Cost: a dump copies and serialises the whole ring (up to TORCH_FR_BUFFER_SIZE entries, 2,000 by default) holding
the GIL, ~10 us per entry here; so the thread reads it rarely (see _adapt), and the live view lags the job by up to
MAX_POLL_S on this source. benchmarks/ledger_cost.py measures it."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TypedDict

from ddpdoctor.analyses.flight import StepTime, Timing, decode_timing, device_time
from ddpdoctor.analyses.ledger import GAP, HOST_BLOCKED

Record = tuple[int, float, dict[str, float]]
MIN_POLL_S = 0.5
MAX_POLL_S = 10.0  # the live view's lag at most
NEW_SHARE = 0.75  # read when about this share of the ring is new: each entry read 1 / 0.75 times on average
BUDGET = 0.002  # share of the time the reads may take (they hold the GIL), where the ring's turnover allows
GIVE_UP_S = 120.0  # a step pending longer than this (a collective that never completes: a hang) is published as a gap
MAX_HELD = 4096  # steps held at most (at ~100 bytes each); beyond, the oldest is published as a gap
# Steps per read at most: the heartbeat carries what was published since its last beat and the live watch keeps 256
# per beat (live/health.py), so a rank's series stays whole and lines up with the other ranks'.
MAX_BATCH_STEPS = 200


def ring_size() -> int:
    """The Flight Recorder's ring size as torch reads it (FlightRecorder.hpp: TORCH_FR_BUFFER_SIZE, then
    TORCH_NCCL_TRACE_BUFFER_SIZE, default 2,000; 0 turns it off)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        value = os.environ.get(name)
        if value is not None:
            try:
                return max(0, int(value))
            except ValueError:
                return 2000
    return 2000


def default_backend() -> str:
    """The default group's backend ("" without one)."""
    import torch.distributed as dist

    try:
        return str(dist.get_backend()) if dist.is_available() and dist.is_initialized() else ""
    except Exception:  # noqa: BLE001 - a group torn down meanwhile
        return ""


def dump_json(backend: str | None = None) -> bytes:
    """The Flight Recorder's JSON dump for ``backend`` (default: the default group's). torch keeps two recorders:
    ProcessGroupNCCL's own, with CUDA events (``_dump_nccl_trace_json``, only in NCCL-enabled builds), and the
    generic one gloo records into (``_dump_fr_trace_json``); NCCL's collectives are only in the first."""
    import torch

    c10d = torch._C._distributed_c10d  # private API, absent from torch's stubs
    if "nccl" in (default_backend() if backend is None else backend):
        fn = getattr(c10d, "_dump_nccl_trace_json", None)
        if fn is not None:
            return bytes(fn())
    return bytes(c10d._dump_fr_trace_json())  # type: ignore[attr-defined]


def grouped_dump(backend: str) -> Callable[[], bytes]:
    """``dump_json(backend)``, refused once an NCCL default group is destroyed: ProcessGroupNCCL's recorder borrows
    its works' CUDA events until the watchdog retires them, so a dump after the group is gone is not asked for."""

    def dump() -> bytes:
        import torch.distributed as dist

        if "nccl" in backend and not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("the NCCL process group was destroyed before its last collectives were read")
        return dump_json(backend)

    return dump


class SourceSummary(TypedDict):
    """How the Flight Recorder source did, for ledger.json (docs/metrics.md)."""

    polls: int
    poll_ms_total: float
    ring: int
    entries_per_s: float
    steps_with_device_time: int
    steps_without: int
    why_without: str | None
    error: str | None


class FlightSource:
    """``hold`` runs on the training thread (the tracker's hold hook); ``poll`` on the ledger's thread (or a test).
    ``publish`` receives each step's record, in step order, once its device time is known or known to be lost."""

    def __init__(self, publish: Callable[[Record], None], dump: Callable[[], bytes] = dump_json,
                 ring: int | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.dump = dump
        self.ring = ring if ring is not None else ring_size()
        self.clock = clock
        self.held: deque[tuple[Record, int, int, float]] = deque()  # record, start ns, end ns, held since
        self.last_id = -1  # the newest record id read so far
        self.rate = 0.0  # entries per second, between the last two reads
        self.step_rate = 0.0  # steps per second, likewise
        self.holds = 0  # steps held so far (the training thread counts)
        self._holds_then = 0
        self.interval = MIN_POLL_S
        self.polls = 0
        self.poll_s = 0.0  # time spent in dump + decode + publish (the thread's own cost)
        self.published = {"device": 0, "gap": 0}
        self.last_gap: str | None = None  # why most gap steps have no device time
        self.gap_reasons: dict[str, int] = {}
        self.error: str | None = None
        self._last_poll = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # poll() from the thread and from close()

    # -- the training thread ---------------------------------------------------------------------------
    def hold(self, record: Record, start_s: float, end_s: float) -> bool:
        self.held.append((record, int(start_s * 1e9), int(end_s * 1e9), self.clock()))
        self.holds += 1
        return True

    # -- the ledger's thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ddpdoctor-ledger", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread; read once more and publish what is still held (as gaps where unknown)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * MAX_POLL_S)
        self.poll(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - the ledger must never disturb the job: say why, keep going
                self.error = f"{type(exc).__name__}: {exc}"[:300]

    def poll(self, final: bool = False) -> int:
        """Read the ring once, publish every held step now decided (in order). Returns how many were published."""
        with self._lock:
            if not self.held:
                self._adapt(None)
                return 0
            t0 = time.perf_counter()
            try:
                entries = decode_timing(self.dump())
            except Exception as exc:  # noqa: BLE001 - no dump now (a group torn down, a failing backend)
                self.error = f"{type(exc).__name__}: {exc}"[:300]
                if not final:
                    self._adapt(None, time.perf_counter() - t0)
                    return 0  # the steps stay held: a later read decides them
                entries = []
            n = self._publish(entries, final)
            cost = time.perf_counter() - t0
            self._adapt(entries, cost)
            self.polls += 1
            self.poll_s += cost
            return n

    def _publish(self, entries: list[Timing], final: bool) -> int:
        held = list(self.held)  # a snapshot: the training thread only appends
        windows = [(rec[0], start, end) for rec, start, end, _ in held]
        # The ring keeps a contiguous run of record ids: those before the oldest one held now were overwritten, so a
        # step that began before it may have lost collectives.
        known_from = entries[0].time_created_ns if entries and entries[0].record_id > 0 else 0
        times = device_time(entries, windows, known_from, newest_ns=entries[-1].time_created_ns if entries else None)
        now = self.clock()
        forced = len(held) - MAX_HELD  # beyond MAX_HELD steps held, the oldest go out undecided
        n = 0
        for (rec, _s, _e, since), st in zip(held, times, strict=True):
            if st.pending and not final and n >= forced and now - since < GIVE_UP_S:
                break  # keep the order: later steps wait for this one
            self.held.popleft()
            self.publish(self._record(rec, st, final))
            n += 1
        return n

    def _record(self, rec: Record, st: StepTime, final: bool) -> Record:
        phases = dict(rec[2])
        host = phases.pop("collective", None)
        if host is not None:
            phases[HOST_BLOCKED] = host
        if st.seconds is not None:
            phases["collective"] = st.seconds
            self.published["device"] += 1
        else:
            phases[GAP] = 0.0
            self.published["gap"] += 1
            if st.missing:
                why = st.missing
            elif final:
                why = "the job ended before its collectives were read complete" + (f" ({self.error})" if self.error
                                                                                    else "")
            else:
                why = f"its collectives did not complete within {GIVE_UP_S:.0f} s"
            self.gap_reasons[why] = self.gap_reasons.get(why, 0) + 1
            self.last_gap = max(self.gap_reasons, key=lambda k: self.gap_reasons[k])  # the most frequent
        return (rec[0], rec[1], phases)

    def _adapt(self, entries: list[Timing] | None, cost_s: float = 0.0) -> None:
        """The next read: as late as the cost allows (a read's cost over BUDGET; it grows with the ring's fill, so
        early reads, with little in the ring, come fast), but before an entry is lost (NEW_SHARE of the ring new)
        and before MAX_BATCH_STEPS steps wait, within [MIN_POLL_S, MAX_POLL_S]. Where they disagree (many
        collectives or steps per second), nothing is lost and the cost is what benchmarks/ledger_cost.py reports."""
        now = self.clock()
        elapsed = max(now - self._last_poll, 1e-3)
        self._last_poll = now
        if entries:
            newest = entries[-1].record_id
            if self.last_id >= 0:
                self.rate = max(0, newest - self.last_id) / elapsed
            self.last_id = newest
        holds = self.holds
        self.step_rate = (holds - self._holds_then) / elapsed
        self._holds_then = holds
        lossless = (NEW_SHARE * self.ring) / self.rate if self.rate > 0 and self.ring > 0 else MAX_POLL_S
        whole = MAX_BATCH_STEPS / self.step_rate if self.step_rate > 0 else MAX_POLL_S
        self.interval = max(MIN_POLL_S, min(cost_s / BUDGET, lossless, whole, MAX_POLL_S))

    def summary(self) -> SourceSummary:
        """For ledger.json: how the source did."""
        return {"polls": self.polls, "poll_ms_total": round(self.poll_s * 1e3, 3), "ring": self.ring,
                "entries_per_s": round(self.rate, 1), "steps_with_device_time": self.published["device"],
                "steps_without": self.published["gap"], "why_without": self.last_gap, "error": self.error}

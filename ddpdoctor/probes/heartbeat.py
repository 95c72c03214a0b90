"""In-rank heartbeat: where this rank is (step, phase, the collective it is in) sent ~1/s to the launcher's monitor.

Transport is one TCP connection to the monitor on loopback (no shared filesystem), opened with a ``hello`` that
carries the job's token (from the environment, launch/transport.py). The monitor may send a request back, one
JSON line ``{"type": T, ...}``; the heartbeat thread answers with the handler registered for T in
REQUEST_HANDLERS ("dump": every thread's Python stack and the Flight Recorder dump, which works while the main
thread waits inside a collective: c10d releases the GIL there). Other packages add request types with
``register_request``.
A faulthandler signal (SIGUSR2: all threads' stacks into RUN/ranks/rankR/stacks.txt) is the fallback when
the thread cannot run."""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ddpdoctor.probes import live
from ddpdoctor.probes.heartbeat_lines import (
    backward_line,
    collective_sizes,
    enter_line,
    group_info,
    main_thread_site,
    main_tid,
    user_call_site,
)
from ddpdoctor.probes.records import Beat, CollectiveState, Dump, RankStatusDoc
from ddpdoctor.probes.requests import REQUEST_HANDLERS, RequestHandler, register_request
from ddpdoctor.probes.steps import backward_label

__all__ = ["REQUEST_HANDLERS", "HeartbeatProbe", "RequestHandler", "register_request"]

# Collective functions wrapped; async_op calls are recorded at launch only (their wait is elsewhere).
COLLECTIVES = (
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter", "barrier",
    "monitored_barrier", "send", "recv", "all_gather_object", "broadcast_object_list", "gather_object",
    "scatter_object_list",
)
DUMP_SIGNAL = signal.SIGUSR2
TOKEN_ENV = "DDPDOCTOR_MONITOR_TOKEN"  # launch/transport.py's; not imported: a rank loads no launcher code
REQUEST_MAX = 1 << 20  # bytes of one request line from the monitor
TICK_S = 0.2


class HeartbeatProbe:
    """Publishes this rank's state; installed by RankSession when the launcher runs a monitor."""

    def __init__(self, monitor: str, rank: int, world_size: int, tracker: Any, stacks_file: Path,
                 interval_s: float = 1.0, source: Any = None) -> None:
        host, _, port = monitor.rpartition(":")
        self.address = (host or "127.0.0.1", int(port))
        self.rank = rank
        self.world_size = world_size
        self.tracker = tracker
        # probes/collectives.CollectiveSource: the waits no torch.distributed call wraps (DDP's buffer broadcast,
        # FSDP2's work.wait(), functional collectives), named by the Flight Recorder.
        self.source = source
        self.interval_s = interval_s
        self.stacks_file = stacks_file
        self.collective: CollectiveState | None = None  # the blocking collective this rank is in now
        self.last_collective: CollectiveState | None = None
        self.failed_collective: CollectiveState | None = None  # the one that raised, if any
        self.backward_site: str | None = None
        self.backward_since: float | None = None
        # Other probes' per-step numbers (name -> number, a few), sent with each beat: job/record.RankRecord.summary.
        self.summary: dict[str, float] = {}
        # probes/divergence.StepFingerprint: this rank's per-step records, sent as "fp" lines each tick (issue 38).
        self.fingerprint: Any = None
        self._originals: dict[tuple[Any, str], Any] = {}
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._stacks_fh: Any = None
        self._buf = b""
        self._send_lock = threading.Lock()
        # The job's secret: kept here and taken out of the environment, so the user's subprocesses do not inherit it.
        self._token = os.environ.pop(TOKEN_ENV, "")

    # -- install / finish ----------------------------------------------------------------------------
    def install(self) -> None:
        if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() == "DETAIL":
            self._avoid_detail_segfault()
        self._wrap_collectives()
        self._wrap_backward()
        try:
            self.stacks_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # ranks/rankR/ is private
            fd = os.open(self.stacks_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # stacks are private
            self._stacks_fh = os.fdopen(fd, "w")
            faulthandler.register(DUMP_SIGNAL, file=self._stacks_fh, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError):
            self._stacks_fh = None
        # Connect before the script runs: its first collective's "enter" must not race the heartbeat thread's
        # connect (a rank that gloo aborts in that collective would otherwise leave no call site). The monitor
        # listens before the ranks start; if this fails, the thread keeps retrying.
        self._connect()
        self._thread = threading.Thread(target=self._loop, name="ddpdoctor-heartbeat", daemon=True)
        self._thread.start()

    def annotate(self, status: RankStatusDoc) -> None:
        """Add the collective this rank failed in and its last one to its status. RankSession calls it before the
        first write of status.json: a rank that torchrun kills while its profiler exports (a peer aborted) keeps it."""
        failed = self.failed_collective
        if failed is None and self.source is not None:
            failed = self.source.failed  # a wait no torch.distributed call of the script's made (FSDP2, DDP's buffers)
        if failed is not None:
            status["failed_collective"] = failed
        if self.last_collective is not None:
            status["last_collective"] = self.last_collective
        elif self.backward_site is not None:  # DDP's all-reduces run inside backward(): its call site stands for them
            status["last_collective"] = {"op": backward_label(self.tracker), "call_site": self.backward_site}

    def finish(self, status: RankStatusDoc) -> None:
        self.annotate(status)
        status["ended_at"] = time.time()
        # A last beat: the steps finished since the previous one (up to a second's worth) reach the live watch,
        # whose rules would otherwise judge a short job on fewer steps than it ran.
        try:
            self._send(self.state())
            recs = self.fingerprint.outgoing(ending=True) if self.fingerprint is not None else []
            if recs:
                self._send({"type": "fp", "rank": self.rank, "fp": recs})
        except Exception:  # noqa: BLE001 - the exit message below matters more
            pass
        self._send({"type": "exit", "status": {k: status.get(k) for k in ("exit_code", "exception", "steps_completed", "exit_site")}})
        self._stop.set()
        for (mod, name), fn in self._originals.items():
            setattr(mod, name, fn)
        self._originals.clear()

    def _avoid_detail_segfault(self) -> None:
        # torch 2.13 (CPU, gloo): with TORCH_DISTRIBUTED_DEBUG=DETAIL, DDP's constructor segfaults in
        # Logger.set_construction_data_and_log (plain torchrun too). Skipping that one log call (it only
        # fills DDP's usage-logging record) lets --debug work; the fingerprint checks are unaffected.
        base = dist.Logger

        class Logger(base):  # type: ignore[misc, valid-type]
            def set_construction_data_and_log(self, *args: Any, **kwargs: Any) -> None:
                if dist.is_initialized() and dist.get_backend() == "gloo":
                    return None
                return super().set_construction_data_and_log(*args, **kwargs)

        self._originals[(dist, "Logger")] = base
        dist.Logger = Logger  # type: ignore[misc]

    # -- collectives ----------------------------------------------------------------------------------
    def _wrap_collectives(self) -> None:
        c10d = dist.distributed_c10d
        for name in COLLECTIVES:
            orig = getattr(c10d, name, None)
            if orig is None:
                continue
            wrapped = self._wrap(name, orig)
            for mod in (dist, c10d):
                if getattr(mod, name, None) is orig:
                    self._originals[(mod, name)] = orig
                    setattr(mod, name, wrapped)

    def _wrap(self, op: str, fn: Any) -> Any:
        probe = self

        @functools.wraps(fn)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if probe.collective is not None:  # nested (e.g. all_gather_object's all_gather): keep the outer
                return fn(*args, **kwargs)
            group = kwargs.get("group")
            if group is None:  # passed by position (all_reduce(t, op, group))
                group = next((a for a in args[1:] if isinstance(a, dist.ProcessGroup)), None)
            name, seq = group_info(group)
            sizes = collective_sizes(args, kwargs)
            if probe.fingerprint is not None:
                probe.fingerprint.saw_collective(op, sizes, args, kwargs)
            state: CollectiveState = {
                "op": op, "group": name, "seq": None if seq is None else seq + 1,
                "sizes": sizes, "call_site": user_call_site(), "since": time.time(),
                "step": probe.tracker.step,
            }
            if kwargs.get("async_op"):
                probe.last_collective = state
                return fn(*args, **kwargs)
            probe.collective = state
            probe.tracker.collective_started()  # its time counts as "collective" in the live phase shares (h18)
            # Told at once (one small send): gloo aborts the process within milliseconds of a mismatch,
            # before the next beat; the monitor then still knows which collective this rank was in.
            probe._send_raw(enter_line(state))
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                probe.failed_collective = {**state, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                raise
            finally:
                probe.tracker.collective_ended()
                probe.collective = None
                probe.last_collective = state

        return collective

    def _wrap_backward(self) -> None:
        # DDP launches its bucket all-reduces from autograd hooks inside backward(): the user's
        # backward() call is the call site of those collectives.
        for mod, name in ((torch.Tensor, "backward"), (torch.autograd, "backward")):
            orig = getattr(mod, name)
            self._originals[(mod, name)] = orig
            setattr(mod, name, self._wrap_one_backward(orig))

    def _wrap_one_backward(self, orig: Any) -> Any:
        probe = self

        @functools.wraps(orig)
        def backward(*args: Any, **kwargs: Any) -> Any:
            outer = probe.backward_since is None
            if outer:
                if probe.fingerprint is not None and args:
                    probe.fingerprint.saw_backward(args[0])
                probe.backward_site = user_call_site()
                probe.backward_since = time.time()
                probe.tracker.phase = "backward"
                # Told at once, as a collective's "enter" is: DDP's bucket all-reduces run in here, and a peer's
                # mismatch can abort this rank within milliseconds, before the next beat says where it was.
                probe._send_raw(backward_line(probe.backward_site, probe.backward_since, probe.tracker))
            try:
                return orig(*args, **kwargs)
            except BaseException as exc:
                if outer:
                    name, seq = group_info(None)
                    probe.failed_collective = {
                        "op": backward_label(probe.tracker), "group": name, "seq": seq, "sizes": [],
                        "call_site": probe.backward_site, "step": probe.tracker.step,
                        "error": f"{type(exc).__name__}: {exc}"[:2000],
                    }
                raise
            finally:
                if outer:
                    probe.backward_since = None
                    if probe.tracker.phase == "backward":
                        probe.tracker.phase = "other"

        return backward

    # -- state ----------------------------------------------------------------------------------------
    def state(self) -> Beat:
        t = self.tracker
        where = main_thread_site()
        coll = self.collective
        if coll is None and self.source is not None:
            coll = self.source.current(where)
        out: Beat = {
            "type": "beat", "rank": self.rank, "pid": os.getpid(), "time": time.time(), "step": t.step,
            "phase": t.phase, "step_started": t.step_started, "last_step_s": t.step_times[-1] if t.step_times else None,
            "max_step_s": max(t.step_times[1:], default=None) if len(t.step_times) > 1 else None,
            "collective": coll, "last_collective": self.last_collective,
            "where": where, "tid": threading.get_native_id(), "main_tid": main_tid(),
            "steps": live.recent_steps(t),  # per-iteration times and phases, for the live health watch (h18)
        }
        if self.summary:  # the last step's small numbers (e.g. probes/ledger.py's): RankRecord.summary
            out["summary"] = dict(self.summary)
        fp = self.fingerprint
        if fp is not None and fp.data.dry_step is not None:  # its training loader ran dry: the hang verdict's evidence
            out["data_dry"] = fp.data.dry_step
        if self.backward_since is not None:
            # DDP's reducer all-reduces buckets during backward: where the default group's count stands.
            name, seq = group_info(None)
            out["backward"] = {"call_site": self.backward_site, "since": self.backward_since, "group": name, "seq": seq}
        return out

    def dump(self) -> Dump:
        """Every thread's Python stack and the Flight Recorder entries (answered from the heartbeat thread)."""
        names = {th.ident: th.name for th in threading.enumerate()}
        parts = []
        for ident, frame in sys._current_frames().items():
            if ident == threading.get_ident():
                continue
            parts.append(f"Thread {ident} ({names.get(ident, '?')}):\n" + "".join(traceback.format_stack(frame)))
        fr: Any = None
        try:
            # Private Flight Recorder API, absent from torch's stubs and from some builds (handled below).
            from ddpdoctor.probes.flight import dump_json  # NCCL's collectives are in NCCL's own recorder

            fr = json.loads(dump_json())
        except Exception as exc:  # noqa: BLE001 - FR missing in this build/backend
            fr = {"error": repr(exc)}
        return {"type": "dump", "rank": self.rank, "stacks": "\n".join(parts), "flight_recorder": fr}

    # -- transport ------------------------------------------------------------------------------------
    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=2.0)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(2.0)
            self._sock = sock
            self._send({"type": "hello", "token": self._token, "rank": self.rank, "pid": os.getpid(),
                        "world_size": self.world_size, "main_tid": main_tid()})
        except OSError:
            self._sock = None

    def _send(self, msg: Mapping[str, object]) -> None:
        if self._sock is not None:
            self._send_raw(json.dumps(msg, default=str).encode() + b"\n")

    def _send_raw(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            with self._send_lock:  # the main thread (enter) and the heartbeat thread share the socket
                sock.sendall(data)
        except OSError:
            self._sock = None

    def _signature(self) -> tuple[Any, ...]:
        c = self.collective
        src = self.source
        return (self.tracker.step, self.tracker.phase, id(c) if c else None, src.since if src is not None else None)

    def _loop(self) -> None:
        # Beat every interval_s, and sooner (after TICK_S) when the rank entered a new collective or phase
        # and stayed there: a rank that aborts seconds later has told the monitor where it was.
        next_beat = 0.0
        sent_sig: tuple[Any, ...] | None = None
        seen_sig: tuple[Any, ...] | None = None
        while not self._stop.is_set():
            if self._sock is None:
                self._connect()
                if self._sock is None:
                    self._stop.wait(self.interval_s)
                    continue
            now = time.time()
            sig = self._signature()
            if now >= next_beat or (sig == seen_sig and sig != sent_sig):
                self._send(self.state())
                next_beat = now + self.interval_s
                sent_sig = sig
            seen_sig = sig
            recs = self.fingerprint.outgoing() if self.fingerprint is not None else []
            if recs:
                self._send({"type": "fp", "rank": self.rank, "fp": recs})
            sock = self._sock
            if sock is None:
                continue
            try:
                ready, _, _ = select.select([sock], [], [], min(TICK_S, max(0.0, next_beat - time.time())))
            except (OSError, ValueError):
                self._sock = None
                continue
            if ready:
                self._read_requests(sock)

    def _read_requests(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._sock = None
            self._stop.set()  # the monitor went away: nothing more to publish
            return
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            self._answer(line)
        if len(self._buf) > REQUEST_MAX:
            self._buf = b""

    def _answer(self, line: bytes) -> None:
        try:
            request = json.loads(line)
        except ValueError:
            return
        if not isinstance(request, dict):
            return
        handler = REQUEST_HANDLERS.get(str(request.get("type")))
        if handler is None:
            return
        reply: Mapping[str, object] | None
        try:
            reply = handler(self, request)
        except Exception as exc:  # noqa: BLE001 - a request never breaks the rank
            reply = {"type": request.get("type"), "error": repr(exc)[:2000]}
        if reply is not None:
            self._send(reply)


REQUEST_HANDLERS["dump"] = lambda probe, request: probe.dump()


def _divergence_stop(probe: HeartbeatProbe, request: Mapping[str, object]) -> None:
    """--on-divergence stop: the job found ranks that diverged; this rank's next optimizer step raises."""
    if probe.fingerprint is not None:
        probe.fingerprint.stopped(str(request.get("reason") or "ranks diverged")[:500])


def _fingerprint_ok(probe: HeartbeatProbe, request: Mapping[str, object]) -> None:
    """--on-divergence stop: every rank's record of this step agreed; the held optimizer step may run."""
    step = request.get("step")
    if probe.fingerprint is not None and type(step) is int:
        probe.fingerprint.agreed(step)


REQUEST_HANDLERS["divergence-stop"] = _divergence_stop
REQUEST_HANDLERS["fp-ok"] = _fingerprint_ok

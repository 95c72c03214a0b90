"""The monitor's live-watch plugin: feeds LiveHealth, prints alerts, relays capture requests to the ranks.

A HangMonitor plugin (launch/monitor.py): on_start, on_message, on_tick, on_stop. Capture requests arrive as files in the run
directory's private control folder (RUN/live/control, mode 0700, created here by the job's owner): only the owner
(or root) can put a file there, and a request is acted on only when its file belongs to the monitor's own user.
The request names a capture kind and a step count, never a path or a process: windows go to RUN/captures/<id>."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ddpdoctor.job.capture_relay import CaptureRequest
from ddpdoctor.live.health import LiveHealth, node_dir
from ddpdoctor.live.protocol import CAPTURE_ID, MAX_STEPS, WINDOW_KINDS
from ddpdoctor.live.records import Alert, CaptureRecord, DivergenceEvidence
from ddpdoctor.live.rules import DEFAULT_CONFIG, HealthConfig
from ddpdoctor.rundir.layout import write_json
from ddpdoctor.safe_io import write_atomic

if TYPE_CHECKING:
    from ddpdoctor.launch.monitor import HangMonitor, RankSnapshot
    from ddpdoctor.live.export import PrometheusExporter, TensorBoardExporter
    from ddpdoctor.rundir.records import RankMessage

POLL_S = 0.5
MAX_REQUEST_BYTES = 4096
CAPTURE_KINDS = (*WINDOW_KINDS, "stacks")


def control_dir(run_root: Path, node: str) -> Path:
    """RUN/live/NODE/control: where `ddpdoctor capture` leaves requests for that node's monitor."""
    return node_dir(run_root, node) / "control"


def captures_dir(run_root: Path) -> Path:
    return run_root / "captures"


class LiveWatch:
    """One per monitor. ``capture_on_slowdown_s``: auto-capture a profile window when slowdown or slow-rank fires,
    at most once per that many seconds (None: off)."""

    def __init__(self, config: HealthConfig = DEFAULT_CONFIG, capture_on_slowdown_s: float | None = None,
                 auto_steps: int = 5, metrics_addr: str | None = None, echo: bool = True,
                 node: str = "node0") -> None:
        self.config = config
        self.node = node  # this monitor's name in RUN/live (node<N>, or rank<R> under --launcher none)
        self.capture_on_slowdown_s = capture_on_slowdown_s
        self.auto_steps = auto_steps
        self.metrics_addr = metrics_addr
        self.echo = echo
        self.health: LiveHealth | None = None
        self.root: Path | None = None
        self.exporters: list[PrometheusExporter | TensorBoardExporter] = []
        if metrics_addr:
            from ddpdoctor.live.export import PrometheusExporter, parse_addr

            # Bound before the launch, so an address that cannot work is bad input (exit 2), not a silent plugin error.
            self.exporters.append(PrometheusExporter(*parse_addr(metrics_addr)))
        self._next_poll = 0.0
        self._last_auto: float | None = None
        self._monitor: HangMonitor | None = None
        self._from_job: list[CaptureRequest] = []  # requests the head forwarded (job store), taken on the poll loop

    # -- monitor plugin hooks ------------------------------------------------------------------------
    def on_start(self, monitor: HangMonitor) -> None:
        self._monitor = monitor
        run_root = Path(monitor.run_root)
        self.root = run_root
        self.health = LiveHealth(run_root, config=self.config, on_alert=self._on_alert, node=self.node)
        ctl = control_dir(run_root, self.node)
        shutil.rmtree(ctl, ignore_errors=True)
        ctl.mkdir(parents=True, mode=0o700)
        os.chmod(ctl, 0o700)  # mkdir's mode is masked by the umask
        from ddpdoctor.live.export import TensorBoardExporter

        self.exporters.append(TensorBoardExporter(run_root / "scalars" / "live"))
        # tensorboard takes ~0.5 s to import: not on the poll loop that also detects hangs.
        threading.Thread(target=_preload_tensorboard, name="ddpdoctor-tb-import", daemon=True).start()

    def on_message(self, monitor: HangMonitor, rank: int, msg: RankMessage) -> None:
        """Every authenticated message from a rank (the monitor's loop thread): keep it fast. A beat's "steps" are
        taken out of it (LiveHealth.ingest skips malformed entries)."""
        if self.health is None:
            return
        kind = msg.get("type")
        if kind == "beat":
            self.health.ingest(rank, msg.pop("steps", None), msg.get("phase"))
        elif kind == "capture" and self.root is not None and isinstance(msg.get("id"), str):
            if CAPTURE_ID.match(msg["id"]):
                _append_reply(captures_dir(self.root) / msg["id"] / "replies.jsonl", rank, msg)

    def on_divergence(self, monitor: HangMonitor, verdict: Mapping[str, object]) -> None:
        """job/divergence.py's verdict (RUN/divergence.json's document): a live alert, shown at once."""
        if self.health is None:
            return
        step, ranks, items = verdict.get("step"), verdict.get("ranks"), verdict.get("items")
        if type(step) is not int or not isinstance(ranks, list):
            return
        first = items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}
        ev: DivergenceEvidence = {"step": step, "ranks": [r for r in ranks if type(r) is int],
                                  "ranks_count": int(verdict.get("ranks_count") or len(ranks)),  # type: ignore[call-overload]
                                  "field": str(first.get("field") or ""),
                                  "on_divergence": str(verdict.get("on_divergence") or "warn")}
        self.health.diverged(ev, f"ranks diverged at step {step}: {verdict.get('reason')}"[:500], time.time())
        for exporter in self.exporters:
            exporter.update(self.health)

    def on_tick(self, monitor: HangMonitor, now: float) -> None:
        """The monitor's poll loop (every ~0.1 s): rules when due, control folder every 0.5 s."""
        if self.health is None or self._monitor is None:
            return
        self.health.world_size = self._monitor.world_size
        self.health.local_ranks = len(self._monitor.links)
        self.health.tick(now)
        for exporter in self.exporters:
            exporter.update(self.health)
        if now >= self._next_poll:
            self._next_poll = now + POLL_S
            for req in self._take_requests():
                self._dispatch(req)
            taken, self._from_job = self._from_job, []
            for req in taken:
                self._dispatch(req, from_job=True)

    def on_job_request(self, monitor: HangMonitor, req: CaptureRequest) -> None:
        """A request the job's head forwarded through the job store (job/agent.py): dispatched on the poll loop."""
        self._from_job.append(req)

    def on_stop(self, monitor: HangMonitor) -> None:
        if self.health is None:
            return
        self.health.finish()
        for exporter in self.exporters:
            exporter.update(self.health)
            exporter.close()
        if self.root is not None:
            shutil.rmtree(control_dir(self.root, self.node), ignore_errors=True)

    # -- alerts --------------------------------------------------------------------------------------
    def _on_alert(self, alert: Alert) -> None:
        if self.echo:
            print(f"ddpdoctor: {alert['id']}: {alert['title']}", file=sys.stderr, flush=True)
        if (self.capture_on_slowdown_s is not None and alert["id"] in ("slowdown", "slow-rank")
                and (self._last_auto is None or time.time() - self._last_auto >= self.capture_on_slowdown_s)):
            self._last_auto = time.time()
            cid = f"auto-{int(self._last_auto)}"
            self._dispatch({"id": cid, "what": "profile", "steps": self.auto_steps, "reason": alert["id"]})

    # -- captures ------------------------------------------------------------------------------------
    def _take_requests(self) -> list[Mapping[str, object]]:
        """The requests in the control folder, as JSON objects (raw: checked in _dispatch), each file taken once."""
        assert self.root is not None
        ctl = control_dir(self.root, self.node)
        out: list[Mapping[str, object]] = []
        try:
            names = sorted(e.name for e in os.scandir(ctl) if e.name.startswith("req-") and e.name.endswith(".json"))
        except OSError:
            return []
        for name in names[:8]:
            path = ctl / name
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                try:
                    st = os.fstat(fd)
                    data = os.read(fd, MAX_REQUEST_BYTES + 1) if stat.S_ISREG(st.st_mode) else b""
                finally:
                    os.close(fd)
            except OSError:
                st, data = None, b""  # a link (O_NOFOLLOW) or unreadable: dropped like any junk
            try:
                os.unlink(path)  # taken once, whatever it was
            except OSError:
                pass
            if st is None or st.st_uid != os.getuid() or not data or len(data) > MAX_REQUEST_BYTES:
                continue  # not the job owner's, or not a request
            try:
                req = json.loads(data)
            except ValueError:
                continue
            if isinstance(req, dict):
                out.append(req)
        return out

    def _dispatch(self, req: Mapping[str, object], from_job: bool = False) -> None:
        """Relay a request to this node's ranks; a request left here by the client (not ``from_job``) also goes to
        the job's other nodes through the job store (the record's ``forwarded`` names them for the client)."""
        assert self.root is not None and self._monitor is not None
        cid, what, steps = str(req.get("id")), req.get("what"), req.get("steps")
        if not CAPTURE_ID.match(cid) or not isinstance(what, str) or what not in CAPTURE_KINDS:
            return
        out = captures_dir(self.root) / cid
        record = out / f"capture-{self.node}.json"  # one per node: every node's monitor relays to its own ranks
        if record.exists():
            return
        out.mkdir(parents=True, mode=0o700, exist_ok=True)
        monitor = self._monitor
        links = {r: st for r, st in monitor.snapshot().items() if st["exit"] is None and st["connected"]}
        state: CaptureRecord = {"id": cid, "what": what, "steps": steps, "requested": time.time(),
                                "ranks": sorted(links), "world_size": monitor.world_size,
                                "reason": req.get("reason", "ddpdoctor capture")}
        if what in WINDOW_KINDS:
            if not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
                write_json(record, dict(state, error=f"steps must be 1..{MAX_STEPS}"))
                return
            manifest = self.root / "manifest.json"
            if manifest.is_file():
                data = json.loads(manifest.read_text())
                data["capture"] = state
                write_json(out / "manifest.json", data)
            # Every rank starts on the same iteration (cross-rank analysis pairs their collectives): a little
            # ahead of the furthest rank by about 2.5 s of iterations, at least 3: beats may be up to 1 s old, the
            # relay takes one send plus the heartbeat thread's next select (0.2 s), and a loaded host adds more.
            at = max(((st["beat"] or {}).get("step") or 0) for st in links.values()) if links else 0
            snap = self.health.last_snapshot if self.health else None
            rate = snap["steps_per_s"] if snap else None
            at += max(3, int(2.5 * rate) + 2 if isinstance(rate, (int, float)) else 3)
            # Several nodes: the client chose one iteration for all of them (their monitors see different beats).
            asked_at = req.get("at_step")
            if isinstance(asked_at, int) and asked_at >= at - 1:
                at = asked_at
            now_at = max(((st["beat"] or {}).get("step") or 0) for st in links.values()) if links else 0
            if from_job and isinstance(asked_at, int) and asked_at > now_at:
                at = asked_at  # the head's choice, while this node's ranks have not passed it: one window for all
            elif not from_job:
                # Through the store, the other nodes take it within a poll or two (0.5 s each) and a beat: more margin.
                margin = max(3, int(3 * rate) + 3 if isinstance(rate, (int, float)) else 3)
                forwarded = monitor.forward(dict(req, id=cid, at_step=at + margin))
                if forwarded:
                    at += margin
                    state["forwarded"] = self._names(forwarded)
            state["at_step"] = at
            for r in links:
                monitor.send(r, {"type": "capture", "id": cid, "what": what, "steps": steps, "at_step": at})
            write_json(record, state)
        else:
            if not from_job:
                forwarded = monitor.forward(dict(req, id=cid))
                if forwarded:
                    state["forwarded"] = self._names(forwarded)
            write_json(record, state)
            threading.Thread(target=self._stacks, args=(out, record, links, state), daemon=True).start()

    def _names(self, nodes: list[int]) -> list[str]:
        """The other nodes' live names, as this node's (node<N>, or rank<N> under --launcher none)."""
        kind = self.node.rstrip("0123456789")
        return [f"{kind}{n}" for n in nodes]

    def _stacks(self, out: Path, record: Path, links: dict[int, RankSnapshot], state: CaptureRecord) -> None:
        """This node's ranks' stacks, raw, owner-only: the client groups every node's together."""
        assert self._monitor is not None
        with self._monitor._lock:
            rank_links = {r: lk for r, lk in self._monitor.links.items() if r in links}
        stacks, _ = self._monitor.collect(rank_links)
        where = {str(r): {k: (st["beat"] or {}).get(k) for k in ("phase", "step")} for r, st in links.items()}
        write_atomic(out / f"stacks-{self.node}.json",
                     json.dumps({"stacks": {str(r): s for r, s in stacks.items()}, "beats": where}))
        write_json(record, dict(state, done=time.time()))


def _preload_tensorboard() -> None:
    try:
        import tensorboard.summary  # noqa: F401
    except ImportError:
        pass


def _append_reply(path: Path, rank: int, msg: Mapping[str, object]) -> None:
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600), "a") as f:
            f.write(json.dumps({"rank": rank, "accepted": bool(msg.get("accepted")),
                                "reason": str(msg.get("reason") or "")[:200]}) + "\n")
    except OSError:
        pass

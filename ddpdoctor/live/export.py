"""The live figures for dashboards: TensorBoard scalars in RUN/scalars/live (always, written as the job runs) and a
Prometheus endpoint (prometheus_client) on the address given with --metrics-addr (off by default)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpdoctor.analyses.ledger import CPU_TIME, CPU_WAIT
from ddpdoctor.errors import BadInput

if TYPE_CHECKING:
    from ddpdoctor.live.health import LiveHealth
    from ddpdoctor.live.records import HealthSnapshot

MAX_RANK_SERIES = 64  # per-rank TensorBoard tags beyond this many ranks would drown the job-level ones


def parse_addr(addr: str) -> tuple[str, int]:
    """"HOST:PORT" (IPv6 in brackets) -> (host, port); BadInput otherwise."""
    host, sep, port = addr.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise BadInput(f"--metrics-addr must be HOST:PORT (e.g. 127.0.0.1:9464), not {addr!r}")
    return host, int(port)


class TensorBoardExporter:
    """Job step time, steps/s and (up to 64 ranks) each rank's step and busy time, one point per new iteration."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self._writer: Any = None
        self._written = 0
        self._diverged = False
        self.failed: str | None = None  # why the live scalars stopped (a full disk); the job goes on

    def update(self, health: LiveHealth) -> None:
        if self.failed is not None:
            return
        points = [p for p in list(health.series) if p.step > self._written]
        if not points and (self._diverged or not any(a["id"] == "divergence" for a in health.alerts)):
            return
        try:
            if self._writer is None:
                from ddpdoctor.renderers.tensorboard import _writer

                self.logdir.mkdir(parents=True, exist_ok=True)
                self._writer = _writer(self.logdir)
            for p in points:
                self._writer.add_scalar("live/step_time_ms", p.seconds * 1e3, p.step)
                for phase, secs in p.phases.items():
                    if phase != CPU_TIME:
                        tag = "live/cpu_wait_ms" if phase == CPU_WAIT else f"live/phase_ms/{phase}"
                        self._writer.add_scalar(tag, secs * 1e3, p.step)
            self._divergence(health)
            if not points:
                self._writer.flush()
                return
            for r, secs in sorted(health.caused_s.items())[:MAX_RANK_SERIES]:  # the ledger's window figure, now
                self._writer.add_scalar(f"live/caused_wait_ms/rank{r}", secs * 1e3, points[-1].step)
            if len(health.ranks) <= MAX_RANK_SERIES:
                for r, hist in list(health.ranks.items()):
                    for rec in list(hist):
                        if rec.step > self._written:
                            self._writer.add_scalar(f"live/rank{r}/step_time_ms", rec.seconds * 1e3, rec.step)
            self._writer.flush()
        except (OSError, RuntimeError) as exc:  # a full disk (the writer then says "closed"): stop, keep watching
            self.failed = f"live TensorBoard scalars stopped: {getattr(exc, 'strerror', None) or exc}"
            return
        self._written = points[-1].step

    def _divergence(self, health: LiveHealth) -> None:
        """The divergence verdict, once: live/divergence/step (the first divergent step) and, per diverged rank (up
        to 64), live/divergence/rankR = 1, both at that step."""
        if self._diverged:
            return
        for a in health.alerts:
            if a["id"] == "divergence":
                ev: Any = a["evidence"]
                self._writer.add_scalar("live/divergence/step", ev["step"], ev["step"])
                for r in ev["ranks"][:MAX_RANK_SERIES]:
                    self._writer.add_scalar(f"live/divergence/rank{r}", 1, ev["step"])
                self._diverged = True
                return

    def close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            except (OSError, RuntimeError) as exc:
                self.failed = self.failed or f"live TensorBoard scalars stopped: {getattr(exc, 'strerror', None) or exc}"
            self._writer = None


class PrometheusExporter:
    """ddpdoctor_* gauges on http://HOST:PORT/metrics, from the latest snapshot (a registry of its own), served by
    one thread whatever the number of connections, to requests whose Host names this server (live/metrics_http.py)."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from ddpdoctor.live.metrics_http import MetricsServer

        self.registry = CollectorRegistry()
        self.snapshot: HealthSnapshot | None = None  # the latest (None before the first)
        self.registry.register(_Collector(self))
        try:
            self._server: MetricsServer | None = MetricsServer(
                host, port, lambda: (generate_latest(self.registry), CONTENT_TYPE_LATEST))
        except (OSError, ValueError) as exc:
            raise BadInput(f"--metrics-addr {host}:{port}: cannot listen ({getattr(exc, 'strerror', None) or exc})") \
                from exc
        self.port = self._server.port

    def update(self, health: LiveHealth) -> None:
        self.snapshot = health.last_snapshot

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


class _Collector:
    def __init__(self, exporter: PrometheusExporter) -> None:
        self.exporter = exporter

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.exporter.snapshot
        if not snap:
            return
        for name, key, doc in (("ddpdoctor_step", "step", "Latest iteration any rank finished."),
                               ("ddpdoctor_step_time_seconds", "step_ms", "The job's median step time (recent)."),
                               ("ddpdoctor_steps_per_second", "steps_per_s", "Iterations per second (recent)."),
                               ("ddpdoctor_ranks_reporting", "ranks_reporting", "Ranks whose iterations arrive.")):
            value = snap.get(key)
            if isinstance(value, (int, float)):
                yield GaugeMetricFamily(name, doc, value=value / 1e3 if key == "step_ms" else value)
        yield GaugeMetricFamily("ddpdoctor_finished", "1 once the job has ended.", value=1 if snap.get("finished") else 0)
        alerts = CounterMetricFamily("ddpdoctor_alerts", "Live alerts raised, by id.", labels=["id"])
        counts: dict[str, int] = {}
        for a in snap.get("alerts") or []:
            counts[a["id"]] = counts.get(a["id"], 0) + 1
        for aid in ("slow-rank", "slowdown", "stall", "divergence"):
            alerts.add_metric([aid], counts.get(aid, 0))
        yield alerts
        diverged = [a for a in snap.get("alerts") or [] if a["id"] == "divergence"]
        if diverged:  # job/divergence.py's verdict: the first step the ranks' fingerprints differ, and who
            ev: Any = diverged[0]["evidence"]
            yield GaugeMetricFamily("ddpdoctor_divergence_step", "First step at which ranks diverged (per-step "
                                    "fingerprint, docs/hangs.md#divergence).", value=ev["step"])
            ranks = GaugeMetricFamily("ddpdoctor_divergence_rank", "1 for each rank that diverged, with the item "
                                      "that differs.", labels=["rank", "item"])
            for r in ev["ranks"]:
                ranks.add_metric([str(r), ev["field"]], 1)
            yield ranks
        step = GaugeMetricFamily("ddpdoctor_rank_step_time_seconds", "Each rank's median step time.", labels=["rank"])
        busy = GaugeMetricFamily("ddpdoctor_rank_busy_seconds", "Each rank's time outside waiting phases per step.",
                                 labels=["rank"])
        share = GaugeMetricFamily("ddpdoctor_rank_phase_share", "Share of the step per phase.", labels=["rank", "phase"])
        caused = GaugeMetricFamily("ddpdoctor_rank_caused_wait_seconds", "How long the other ranks wait for this "
                                   "one per step (collective ledger, docs/metrics.md#caused-wait).", labels=["rank"])
        runq = GaugeMetricFamily("ddpdoctor_rank_cpu_wait_seconds", "How long this rank's training thread waited "
                                 "for a CPU per step (run queue; docs/metrics.md#caused-wait).", labels=["rank"])
        for r, v in (snap.get("ranks") or {}).items():
            if isinstance(v.get("caused_wait_ms"), (int, float)):
                caused.add_metric([r], v["caused_wait_ms"] / 1e3)
            if isinstance(v.get("cpu_wait_ms"), (int, float)):
                runq.add_metric([r], v["cpu_wait_ms"] / 1e3)
            step.add_metric([r], v["step_ms"] / 1e3)
            busy.add_metric([r], v["busy_ms"] / 1e3)
            for phase, x in (v.get("phase_share") or {}).items():
                share.add_metric([r, phase], x)
        yield step
        yield busy
        yield share
        yield caused
        yield runq

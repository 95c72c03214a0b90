"""Every finding id ddpdoctor can print: its docs area and anchor, the severities it may carry, and the one module
that builds it (docs/findings.md is the user's view of this table; tests/unit/test_findings_catalog.py holds the
two, and the code's Finding(...) calls, together).

To add a finding: a row here, a section (and an index row) in docs/findings.md under the anchor ``area-id``, and
the rule in the owner module. An id shared by several areas (``hang``, ``rank-crashed`` ...) is one problem seen
from different evidence: one row per area, each with its own docs section and evidence contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddpdoctor.findings.model import Finding, Severity

# The docs/findings.md sections, in their order.
AREAS = ("job", "perf", "diff", "hangs", "live", "logs", "sync", "topo", "preflight", "tune")
_LETTERS = {"E": Severity.ERROR, "W": Severity.WARNING, "I": Severity.INFO}


@dataclass(frozen=True)
class FindingKind:
    """One row of the catalogue. ``owner`` is the module whose rule builds the finding."""

    id: str
    area: str
    severities: tuple[Severity, ...]
    owner: str

    @property
    def anchor(self) -> str:
        """The docs/findings.md anchor of this row's section (``perf-exposed-comm-high``)."""
        return f"{self.area}-{self.id.replace('.', '-').replace('_', '-')}"

    @property
    def docs(self) -> str:
        return f"docs/findings.md#{self.anchor}"


def K(id: str, area: str, severities: str, owner: str) -> FindingKind:  # noqa: N802 - a table row, kept short
    return FindingKind(id, area, tuple(_LETTERS[c] for c in severities), owner)


CATALOG: tuple[FindingKind, ...] = (
    K("no-ranks-started", "job", "E", "ddpdoctor.findings.job"),
    K("rank-no-status", "job", "EI", "ddpdoctor.findings.job"),
    K("no-steps-seen", "job", "W", "ddpdoctor.findings.job"),
    K("no-ddp", "job", "I", "ddpdoctor.findings.job"),
    K("parallelism", "job", "I", "ddpdoctor.findings.parallelism"),
    K("parallelism-differs", "job", "W", "ddpdoctor.findings.parallelism"),
    K("not-measurable", "perf", "I", "ddpdoctor.findings.perf_verdict"),
    K("profile-window-not-reached", "perf", "W", "ddpdoctor.findings.window"),
    K("exposed-comm-high", "perf", "WI", "ddpdoctor.findings.perf"),
    K("comm-tail-after-backward", "perf", "W", "ddpdoctor.findings.perf"),
    K("buckets-latency-bound", "perf", "WI", "ddpdoctor.findings.perf"),
    K("first-bucket-late", "perf", "W", "ddpdoctor.findings.perf"),
    K("sync-in-backward", "perf", "WI", "ddpdoctor.findings.perf_sync_in_backward"),
    K("find-unused-parameters-unneeded", "perf", "W", "ddpdoctor.findings.perf_ddp_flags"),
    K("static-graph-would-help", "perf", "I", "ddpdoctor.findings.perf_ddp_flags"),
    K("find-unused-parameters-on", "perf", "I", "ddpdoctor.findings.perf_ddp_flags"),
    K("gradient-as-bucket-view-off", "perf", "I", "ddpdoctor.findings.perf_ddp_flags"),
    K("straggler-rank", "perf", "W", "ddpdoctor.findings.perf_balance"),
    K("fsdp-no-prefetch", "perf", "WI", "ddpdoctor.findings.perf_fsdp"),
    K("fsdp-comm-synchronous", "perf", "I", "ddpdoctor.findings.perf_fsdp"),
    K("step-time-variance", "perf", "W", "ddpdoctor.findings.perf_balance"),
    K("step-time-rank-skew", "perf", "W", "ddpdoctor.findings.perf_balance"),
    K("data-loading-wait", "perf", "W", "ddpdoctor.findings.perf_balance"),
    K("no-communication", "perf", "I", "ddpdoctor.findings.perf"),
    K("single-rank-ddp", "perf", "I", "ddpdoctor.findings.perf"),
    K("rank-no-communication", "perf", "W", "ddpdoctor.findings.perf"),
    K("no-profiler-steps", "perf", "I", "ddpdoctor.findings.perf_wholetrace"),
    K("bucket-cap-whatif", "perf", "WI", "ddpdoctor.findings.perf_whatif"),
    K("diff-step-slower", "diff", "W", "ddpdoctor.findings.diff"),
    K("diff-step-faster", "diff", "I", "ddpdoctor.findings.diff"),
    K("diff-not-measurable", "diff", "I", "ddpdoctor.findings.diff"),
    K("diff-bucket-layout", "diff", "I", "ddpdoctor.findings.diff"),
    K("job-stopped", "job", "W", "ddpdoctor.findings.job"),
    K("run-unfinished", "job", "EW", "ddpdoctor.findings.job"),
    K("aborted-after-finish", "job", "W", "ddpdoctor.findings.job"),
    K("disk-full", "job", "W", "ddpdoctor.findings.job"),
    K("hang", "hangs", "E", "ddpdoctor.findings.failure"),
    K("long-stall", "hangs", "W", "ddpdoctor.findings.hang"),
    K("rank-left-early", "hangs", "E", "ddpdoctor.findings.crash"),
    K("collective-mismatch", "hangs", "E", "ddpdoctor.findings.hang"),
    K("divergence", "hangs", "E", "ddpdoctor.findings.divergence"),
    K("rank-crashed", "hangs", "E", "ddpdoctor.findings.failure"),
    K("unused-parameters", "hangs", "EWI", "ddpdoctor.findings.crash"),
    K("head-lost", "hangs", "E", "ddpdoctor.findings.failure"),
    K("slow-rank", "live", "W", "ddpdoctor.live.findings"),
    K("slowdown", "live", "W", "ddpdoctor.live.findings"),
    K("stall", "live", "W", "ddpdoctor.live.findings"),
    K("hang", "logs", "E", "ddpdoctor.findings.failure"),
    K("rank-crashed", "logs", "E", "ddpdoctor.findings.failure"),
    K("collective-mismatch", "logs", "E", "ddpdoctor.logs.rules"),
    K("unused-parameters", "logs", "EWI", "ddpdoctor.logs.rules"),
    K("misleading-root-cause", "logs", "W", "ddpdoctor.logs.crashes"),
    K("job-failed", "logs", "E", "ddpdoctor.logs.crashes"),
    K("oom", "logs", "E", "ddpdoctor.logs.triage"),
    K("model-mismatch", "logs", "E", "ddpdoctor.logs.triage"),
    K("nccl-error", "logs", "E", "ddpdoctor.logs.triage"),
    K("cuda-error", "logs", "E", "ddpdoctor.logs.triage"),
    K("watchdog-stuck", "logs", "E", "ddpdoctor.logs.triage"),
    K("param-ready-twice", "logs", "E", "ddpdoctor.logs.triage"),
    K("fsdp-error", "logs", "E", "ddpdoctor.logs.triage"),
    K("job-stopped", "logs", "EW", "ddpdoctor.logs.triage"),
    K("store-failure", "logs", "E", "ddpdoctor.logs.triage"),
    K("peer-lost", "logs", "E", "ddpdoctor.logs.triage"),
    K("unrecognised-failure", "logs", "E", "ddpdoctor.logs.triage"),
    K("grad-divergence", "sync", "EI", "ddpdoctor.findings.sync"),
    K("param-divergence", "sync", "EI", "ddpdoctor.findings.sync"),
    K("buffer-divergence", "sync", "EWI", "ddpdoctor.findings.sync"),
    K("shard-layout-differs", "sync", "E", "ddpdoctor.findings.sync"),
    K("optimizer-steps-differ", "sync", "E", "ddpdoctor.findings.sync"),
    K("nothing-compared", "sync", "W", "ddpdoctor.findings.sync"),
    K("grads-never-synced", "sync", "E", "ddpdoctor.findings.sync"),
    K("nonfinite-values", "sync", "E", "ddpdoctor.findings.sync"),
    K("ddp-equivalence", "sync", "EI", "ddpdoctor.findings.sync"),
    K("unused-parameters", "sync", "EWI", "ddpdoctor.findings.sync"),
    K("sampler-overlap", "sync", "EI", "ddpdoctor.findings.sync_data"),
    K("sampler-coverage", "sync", "EWI", "ddpdoctor.findings.sync_data"),
    K("sampler-no-set-epoch", "sync", "W", "ddpdoctor.findings.sync_data"),
    K("sampler-shuffle-conflict", "sync", "E", "ddpdoctor.findings.sync_data"),
    K("sampler-uneven-batches", "sync", "E", "ddpdoctor.findings.sync_data"),
    K("sampler-seed-mismatch", "sync", "E", "ddpdoctor.findings.sync_data"),
    K("sampler-dataset-differs", "sync", "E", "ddpdoctor.findings.sync_data"),
    K("net-socket-internode", "topo", "EW", "ddpdoctor.topo.rules"),
    K("ib-disabled-by-env", "topo", "EW", "ddpdoctor.topo.rules"),
    K("net-device-missing", "topo", "EW", "ddpdoctor.topo.rules"),
    K("gdr-disabled", "topo", "W", "ddpdoctor.topo.rules"),
    K("gdr-disabled-by-env", "topo", "W", "ddpdoctor.topo.rules"),
    K("p2p-disabled", "topo", "WI", "ddpdoctor.topo.rules_gpu"),
    K("p2p-pcie-risk", "topo", "W", "ddpdoctor.topo.rules_gpu"),
    K("nvlink-unused", "topo", "W", "ddpdoctor.topo.rules_gpu"),
    K("nvls-unavailable", "topo", "WI", "ddpdoctor.topo.rules_gpu"),
    K("bad-socket-ifname", "topo", "EW", "ddpdoctor.topo.rules"),
    K("nccl-version-mismatch", "topo", "E", "ddpdoctor.topo.rules"),
    K("env-mismatch", "topo", "W", "ddpdoctor.topo.rules"),
    K("few-channels", "topo", "W", "ddpdoctor.topo.rules_gpu"),
    K("p2p-consumer-gpu", "topo", "W", "ddpdoctor.topo.evidence"),
    K("gpus-behind-pcie-switch", "topo", "WI", "ddpdoctor.topo.evidence"),
    K("ofi-no-efa-device", "topo", "EW", "ddpdoctor.topo.evidence"),
    K("nccl-tests-no-mpi", "topo", "E", "ddpdoctor.topo.evidence"),
    K("comm-per-node", "topo", "E", "ddpdoctor.topo.evidence"),
    K("nccl-shared-mem-exceeded", "topo", "W", "ddpdoctor.topo.evidence"),
    K("few-nics", "topo", "W", "ddpdoctor.topo.rules_xml"),
    K("nic-numa-mismatch", "topo", "W", "ddpdoctor.topo.rules_xml"),
    K("not-distributed", "topo", "E", "ddpdoctor.topo.rules_gpu"),
    K("roce-network-error", "topo", "E", "ddpdoctor.topo.rules"),
    K("forced-algo-ignored", "topo", "W", "ddpdoctor.topo.rules_gpu"),
    K("mixed-link-layer", "topo", "W", "ddpdoctor.topo.rules"),
    K("ranks-interleaved", "topo", "I", "ddpdoctor.topo.rules_gpu"),
    K("nccl-warning", "topo", "W", "ddpdoctor.topo.rules"),
    K("numa-unknown", "topo", "I", "ddpdoctor.topo.rules_xml"),
    K("pcie-link-degraded", "topo", "W", "ddpdoctor.topo.rules_xml"),
    K("nic-speed-mismatch", "topo", "W", "ddpdoctor.topo.rules_xml"),
    K("topology-truncated", "topo", "I", "ddpdoctor.topo.rules_xml"),
    K("nccl-not-used", "topo", "I", "ddpdoctor.topo.capture"),
    K("preflight.launcher_env", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.rendezvous", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.versions", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.dist_env", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.collectives", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.allreduce_bandwidth", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.allreduce_latency", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.compute", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.gpu_health", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.checkpoint_dir", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.clock_skew", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("preflight.nccl_topology", "preflight", "EW", "ddpdoctor.preflight.checks"),
    K("tune-winner", "tune", "WI", "ddpdoctor.findings.tune"),
    K("tune-no-winner", "tune", "I", "ddpdoctor.findings.tune"),
    K("tune-numerics-changed", "tune", "W", "ddpdoctor.findings.tune"),
    K("tune-numerics-differ", "tune", "I", "ddpdoctor.findings.tune"),
    K("tune-not-applied", "tune", "W", "ddpdoctor.findings.tune"),
    K("tune-trial-failed", "tune", "EW", "ddpdoctor.findings.tune"),
)

_BY_ID: dict[str, tuple[FindingKind, ...]] = {}
for _k in CATALOG:
    _BY_ID[_k.id] = (*_BY_ID.get(_k.id, ()), _k)


def kinds(finding_id: str) -> tuple[FindingKind, ...]:
    """The catalogue rows of ``finding_id`` (several when areas share it); () for an id ddpdoctor never prints."""
    return _BY_ID.get(finding_id, ())


def known(finding_id: str) -> bool:
    return finding_id in _BY_ID


def severity_allowed(finding: Finding) -> bool:
    """Whether ``finding`` carries a severity its catalogue rows allow. A performance finding of a run that crashed,
    hung or was stopped is demoted to info (docs/findings.md, "Failure first")."""
    rows = kinds(finding.id)
    if any(finding.severity in k.severities for k in rows):
        return True
    demoted = finding.severity is Severity.INFO and "incomplete_run" in finding.evidence
    return demoted and any(k.area == "perf" for k in rows)


def docs_link(finding_id: str) -> str | None:
    """Where docs/findings.md explains ``finding_id`` (its first area), or None for an unknown id."""
    rows = kinds(finding_id)
    return rows[0].docs if rows else None

"""The preflight check record: one row per check (pass / warn / fail / skipped, with evidence) and its finding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from ddpdoctor.findings.model import Finding, Severity

PASS, WARN, FAIL, SKIPPED = "pass", "warn", "fail", "skipped"
STATUSES = (PASS, WARN, FAIL, SKIPPED)

# Check ids, in the order the table shows them; each is documented in docs/preflight.md.
CHECKS: dict[str, str] = {
    "launcher_env": "Launcher environment consistent across ranks",
    "rendezvous": "Every rank joins the rendezvous in time",
    "versions": "Same torch, CUDA, NCCL and driver on every rank",
    "dist_env": "Same NCCL_* and TORCH_* environment on every rank",
    "collectives": "all_reduce, all_gather, broadcast, reduce_scatter give the right values",
    "allreduce_bandwidth": "all_reduce bus bandwidth (1 KB .. max size)",
    "allreduce_latency": "Small-message all_reduce latency",
    "compute": "Per-rank matmul throughput (slow rank)",
    "gpu_health": "GPU memory, ECC errors and throttling",
    "checkpoint_dir": "Checkpoint directory writable with free space",
    "clock_skew": "Clock skew between ranks",
    "nccl_topology": "NCCL topology findings",
}

_SEVERITY = {FAIL: Severity.ERROR, WARN: Severity.WARNING}


class CheckRowJson(TypedDict, total=False):
    """One row of preflight's checks table in the report (docs/json.md `preflight`): CheckResult.to_json, or a
    saved report's row (every key optional there)."""

    id: str
    status: str  # "pass" | "warn" | "fail" | "skipped"
    summary: str
    ranks: list[int]
    evidence: dict[str, object]


@dataclass
class CheckResult:
    id: str
    status: str
    summary: str  # one line for the table
    evidence: dict[str, Any] = field(default_factory=dict)  # an evidence map: free-form per check, shown as is
    ranks: list[int] = field(default_factory=list)  # the ranks at fault (fail/warn)
    advice: str = ""

    def to_json(self) -> CheckRowJson:
        return {"id": self.id, "status": self.status, "summary": self.summary, "ranks": list(self.ranks),
                "evidence": self.evidence}

    def finding(self) -> Finding | None:
        """A failed check is an error finding, a warning a warning finding; the id is ``preflight.<check>``."""
        severity = _SEVERITY.get(self.status)
        if severity is None:
            return None
        return Finding(
            id=f"preflight.{self.id}", severity=severity, title=f"{CHECKS.get(self.id, self.id)}: {self.summary}",
            ranks=list(self.ranks), evidence=self._finding_evidence(), advice=self.advice,
        )

    def _finding_evidence(self) -> dict[str, Any]:  # the Finding's evidence map (findings/model.py)
        # The finding carries what explains the verdict; bulky tables stay in the check row.
        evidence = {k: v for k, v in self.evidence.items() if k not in ("rows", "traceback")}
        per_rank = evidence.get("per_rank")
        if isinstance(per_rank, dict) and self.ranks:
            evidence["per_rank"] = {r: v for r, v in per_rank.items() if int(r) in self.ranks}
        return evidence


def exit_code(checks: list[CheckResult]) -> int:
    """1 when any check failed, else 0 (warnings and skipped checks do not fail a preflight)."""
    return 1 if any(c.status == FAIL for c in checks) else 0

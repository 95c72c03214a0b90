"""The preflight's nccl_topology row: `ddpdoctor topo`'s findings on what the ranks printed (or why there are
none), turned into one check result."""

from __future__ import annotations

from typing import Any

from ddpdoctor.findings.model import Finding
from ddpdoctor.preflight.checks import FAIL, PASS, SKIPPED, WARN, CheckResult


def topology_input(result: Any) -> list[Finding] | str:
    """Normalise ddpdoctor.topo.capture.analyze_run_dir's (section, findings) into findings, or the reason there
    are none (NCCL not used, no NCCL lines)."""
    if isinstance(result, tuple) and len(result) == 2:
        section, findings = result
        if isinstance(section, dict) and section.get("nccl_used") is False:
            return f"NCCL not used: {section.get('reason', 'no NCCL output')}"
        result = findings
    if isinstance(result, list) and all(isinstance(f, Finding) for f in result):
        return result
    return "the topology analysis returned no findings list"


def check_topology(topo: list[Finding] | str | None) -> CheckResult:
    """The topo helper's findings (a list), or why they are absent (a string). Info findings do not warn."""
    if topo is None or isinstance(topo, str):
        return CheckResult("nccl_topology", SKIPPED, topo or "NCCL not used", {})
    worst = max((f.severity.rank for f in topo), default=-1)
    status = FAIL if worst >= 2 else WARN if worst == 1 else PASS
    serious = [f for f in topo if f.severity.rank >= 1]
    summary = (f"{len(serious)} findings: {', '.join(f.id for f in serious[:4])}" if serious
               else "no topology problems")
    evidence = {"findings": [{"id": f.id, "severity": f.severity.value, "title": f.title, "advice": f.advice}
                             for f in topo]}
    ranks = sorted({r for f in serious for r in f.ranks})
    return CheckResult("nccl_topology", status, summary, evidence, ranks,
                       "See each topology finding's advice (docs/findings.md).")

"""`--nccl-debug` capture: the NCCL environment a rank starts with, and the analysis of what the ranks printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.topo.section_types import NcclNotUsed, RunTopology

NCCL_DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET,GRAPH"}
TOPO_FILE = "nccl_topo.xml"


def rank_env(run_dir: Path, rank: int, debug_file: bool = False) -> dict[str, str]:
    """Environment for rank ``rank``: NCCL INFO logging of init/env/net/graph and a topology dump in its rank dir.

    NCCL writes the dump only from global rank NCCL_TOPO_DUMP_FILE_RANK (default 0), so in practice
    ranks/rank0/nccl_topo.xml appears; the per-rank path keeps ranks from clobbering each other's file.
    ``debug_file`` sends NCCL's lines to ranks/rankR/nccl_debug.<host>.<pid>.log instead of the rank's stdout.
    """
    rank_dir = Path(run_dir) / "ranks" / f"rank{rank}"
    rank_dir.mkdir(parents=True, exist_ok=True)
    env = {**NCCL_DEBUG_ENV, "NCCL_TOPO_DUMP_FILE": str(rank_dir / TOPO_FILE)}
    if debug_file:
        env["NCCL_DEBUG_FILE"] = str(rank_dir / "nccl_debug.%h.%p.log")  # NCCL expands %h host, %p pid
    return env


def job_env(run_dir: Path) -> dict[str, str]:
    """The same settings for a launcher that can only give every rank one environment (dump from rank 0)."""
    return rank_env(run_dir, 0)


def is_run_dir(path: Path) -> bool:
    return (path / "ranks").is_dir() or (path / "manifest.json").is_file()


def _not_used(backend: str | None, why: str) -> tuple[NcclNotUsed, list[Finding]]:
    section: NcclNotUsed = {"nccl_used": False, "backend": backend, "reason": why}
    return section, [Finding(
        "nccl-not-used", Severity.INFO, f"NCCL was not used ({why}): there is no fabric to check",
        evidence={"backend": backend} if backend else {},
        advice="Topology checks need the nccl backend on GPUs; gloo runs over TCP on the CPU by design.",
    )]


def analyze_run_dir(run_dir: Path, backend: str | None) -> tuple[RunTopology | NcclNotUsed, list[Finding]]:
    """The "topology" section and findings from RUN/ranks/rank*/{stdout.log,stderr.log,nccl_topo.xml}
    (and torchrun's per-rank logs). ``backend`` is the process group's backend when known."""
    from ddpdoctor.topo.diagnose import diagnose, read_inputs

    ranks = Path(run_dir) / "ranks"
    logs = sorted(ranks.glob("rank*/stdout.log")) + sorted(ranks.glob("rank*/stderr.log"))
    logs += sorted(ranks.glob("rank*/nccl_debug*.log"))  # NCCL_DEBUG_FILE output
    # torchrun --tee writes the ranks' output under RUN/torchrun/<run id>/attempt_N/R/std{out,err}.log
    logs += sorted((Path(run_dir) / "torchrun").glob("**/std*.log"))
    xmls = sorted(ranks.glob(f"rank*/{TOPO_FILE}"))
    if backend is not None and "nccl" not in backend and not xmls:  # "cpu:gloo,cuda:nccl" uses NCCL
        return _not_used(backend, f"the process group backend was {backend}")
    inputs = read_inputs([p for p in logs if p.stat().st_size > 0], xmls)
    if inputs.log.nccl_lines == 0 and not inputs.systems:
        return _not_used(backend, "the ranks printed no NCCL lines")
    sections, findings = diagnose(inputs.log, inputs.systems)
    section: RunTopology = {"nccl_used": True, "backend": backend, **sections}
    return section, findings


def run_backend(run_dir: Path) -> str | None:
    """The process group backend the run's manifest recorded, or None."""
    from ddpdoctor.errors import BadInput
    from ddpdoctor.rundir.layout import read_json

    try:
        data = read_json(Path(run_dir) / "manifest.json")
    except BadInput:  # a run without a usable manifest still gets its logs read
        return None
    backend = data.get("backend") if isinstance(data, dict) else None
    return str(backend) if backend else None


def add_to_report(report: Any, run: Any) -> None:
    """Put the "topology" section and findings of a finished --nccl-debug run into its report."""
    section, findings = analyze_run_dir(run.root, run_backend(run.root))
    report.sections["topology"] = section
    report.findings.extend(findings)

"""Reads the files given to `ddpdoctor topo` (logs and XML, with bad-input checks) and builds sections + findings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ddpdoctor.errors import BadInput
from ddpdoctor.findings.model import Finding
from ddpdoctor.logs.lines import strip_collector
from ddpdoctor.safe_io import max_input_bytes, read_bytes
from ddpdoctor.terminal_text import strip_ansi
from ddpdoctor.topo import analysis, evidence
from ddpdoctor.topo.nccl_log import parse_lines
from ddpdoctor.topo.parsed_log import NcclLog
from ddpdoctor.topo.rules import log_findings
from ddpdoctor.topo.rules_xml import xml_findings
from ddpdoctor.topo.section_types import TopoSections
from ddpdoctor.topo.topo_xml import TopoSystem, parse_topo_xml

_SNIFF = 8192
MAX_BYTES = 1 << 30  # an NCCL_DEBUG=INFO log of a big job is a few hundred MB at most


@dataclass
class Inputs:
    log: NcclLog = field(default_factory=NcclLog)
    systems: list[TopoSystem] = field(default_factory=list)
    used: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "PATH: problem", one per unusable file
    extra: evidence.Evidence = field(default_factory=evidence.Evidence)


def _read_text(path: Path) -> str:
    """The file's text; raises ValueError with the user-facing problem when it is not a usable text file."""
    try:
        # Regular files only (a FIFO or /dev/zero would block or never end); gzip streamed with a cap.
        data = read_bytes(path, max_input_bytes(MAX_BYTES))
    except BadInput as exc:
        raise ValueError(exc.problem) from exc
    if not data.strip():
        raise ValueError("empty file")
    if b"\x00" in data[:_SNIFF]:
        raise ValueError("binary data, not an NCCL log or topology XML")
    text = data.decode("utf-8", errors="replace")
    if text[:_SNIFF].count("\ufffd") > 64:
        raise ValueError("binary data, not an NCCL log or topology XML")
    return _as_written(text)


def _as_written(text: str) -> str:
    """The log as NCCL and nccl-tests wrote it: colour codes and a log collector's line prefixes (containerd,
    CloudWatch, Ray: the same ones `logs` reads through) removed, line ends made "\n"."""
    text = strip_ansi(text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    head = text[:_SNIFF].splitlines()[:50]
    if head and sum(_uncollected(ln) != ln for ln in head) * 2 >= len(head):
        text = "\n".join(_uncollected(ln) for ln in text.split("\n"))
    return text


_HOST_COLUMN = re.compile(r"[\w.-]+ \| ")  # "TIME | host | line": the topo grammar reads the host from it


def _uncollected(line: str) -> str:
    rest = strip_collector(line)
    return line if rest is line or _HOST_COLUMN.match(rest) else rest


def _looks_xml(text: str) -> bool:
    head = text[:_SNIFF].lstrip()
    return head.startswith("<") and any(t in text[:65536] for t in ("<system", "<graphs", "<cpu", "<pci", "<gpu"))


def read_inputs(logs: list[Path], xmls: list[Path]) -> Inputs:
    """Parse every file that can be parsed; every other one becomes a one-line problem (never an exception)."""
    inputs = Inputs()
    for path, forced_xml in [(p, False) for p in logs] + [(p, True) for p in xmls]:
        try:
            text = _read_text(path)
        except ValueError as exc:
            inputs.problems.append(f"{path}: {exc}")
            continue
        if forced_xml or _looks_xml(text):
            system = parse_topo_xml(text, str(path))
            if not system.usable:
                inputs.problems.append(f"{path}: no NCCL topology elements (<system>, <cpu>, <pci>, <gpu>, <graphs>)")
                continue
            inputs.systems.append(system)
            evidence.scan_xml(inputs.extra, text)
        else:
            before = len(inputs.extra.devices) + len(inputs.extra.ofi_loaded) + len(inputs.extra.efa_nodev)
            evidence.scan(inputs.extra, text)
            nccl_tests = len(inputs.extra.devices) + len(inputs.extra.ofi_loaded) + len(inputs.extra.efa_nodev) > before
            if parse_lines(inputs.log, str(path), text.splitlines()) == 0 and not nccl_tests:
                inputs.log.files.remove(str(path))
                inputs.problems.append(
                    f"{path}: no NCCL lines (was the job run with NCCL_DEBUG=INFO, and is this its output?)"
                )
                continue
        inputs.used.append(str(path))
    return inputs


_MEANINGLESS_WITHOUT_MPI = frozenset((
    "not-distributed", "ranks-interleaved", "net-socket-internode", "few-channels", "few-nics", "comm-per-node",
    "mixed-link-layer", "nvlink-unused", "forced-algo-ignored", "nic-numa-mismatch"))


def diagnose(log: NcclLog, systems: list[TopoSystem],
             extra: evidence.Evidence | None = None) -> tuple[TopoSections, list[Finding]]:
    """Report sections ("summary", "hosts", "ranks", "transports", "channels", "topology", "warnings", "inputs")
    and the findings."""
    facts = analysis.derive(log, systems)
    findings = log_findings(facts) + xml_findings(systems)
    if extra is not None:
        known = {f.id for f in findings}
        findings += [f for f in evidence.findings(extra, facts.nodes) if f.id not in known
                     and not (f.id == "p2p-consumer-gpu" and "p2p-pcie-risk" in known)]
        if any(f.id == "nccl-tests-no-mpi" for f in findings):
            # Separate one-rank jobs: what would be read as the job's network, channels or rank layout is not one.
            findings = [f for f in findings if f.id not in _MEANINGLESS_WITHOUT_MPI]
    sections: TopoSections = {
        "summary": analysis.summary(facts),
        "hosts": analysis.hosts_section(facts),
        "ranks": analysis.ranks_section(facts),
        "transports": analysis.transports_section(facts),
        "channels": analysis.channels_section(facts),
        "topology": analysis.topology_section(systems),
        "warnings": [ln.ref() for ln in log.warnings[:50]],
        "inputs": {"logs": list(log.files), "topology_files": [s.file for s in systems],
                   "nccl_lines": log.nccl_lines},
    }
    return sections, findings

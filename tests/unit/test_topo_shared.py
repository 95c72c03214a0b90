"""Validation on the real logs and topology files in ../shared/nccl: each header says what must be found."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddpdoctor.topo.diagnose import diagnose, read_inputs
from tests.conftest import SHARED

LOGS = SHARED / "nccl" / "logs"
TOPO = SHARED / "nccl" / "topo"

Check = Callable[[re.Match[str], dict[str, Any]], None]


def _ids(report: dict[str, Any]) -> dict[str, str]:
    return {f.id: f.severity.value for f in report["findings"]}


def _has(fid: str, severity: str | None = None) -> Check:
    def check(m: re.Match[str], r: dict[str, Any]) -> None:
        ids = _ids(r)
        assert fid in ids, f"expected {fid}, found {sorted(ids)}"
        if severity:
            assert ids[fid] == severity

    return check


def _lacks(fid: str) -> Check:
    def check(m: re.Match[str], r: dict[str, Any]) -> None:
        assert fid not in _ids(r)

    return check


def _summary(key: str, value: Callable[[re.Match[str]], Any]) -> Check:
    def check(m: re.Match[str], r: dict[str, Any]) -> None:
        assert r["summary"][key] == value(m), (key, r["summary"])

    return check


def _contains(key: str, item: str) -> Check:
    def check(m: re.Match[str], r: dict[str, Any]) -> None:
        assert item in r["summary"][key], (key, r["summary"][key])

    return check


def _version(m: re.Match[str], r: dict[str, Any]) -> None:
    assert any(v.startswith(m.group(1)) for v in r["summary"]["nccl_versions"]), r["summary"]["nccl_versions"]


def _plugin(m: re.Match[str], r: dict[str, Any]) -> None:
    assert any("OFI" in p for h in r["sections"]["hosts"] for p in h["plugins"])


# Header phrase -> what ddpdoctor must report. Every log file must match at least two of these.
LOG_EXPECT: list[tuple[str, Check]] = [
    (r"VERSION SKEW", _has("nccl-version-mismatch", "error")),
    (r"ibv_modify_qp failed", _has("roce-network-error", "error")),
    (r"falls back to NET/Socket|Inter-node: NET/Socket", _has("net-socket-internode", "error")),
    (r"IB devices were not usable", _has("net-device-missing")),
    (r"NCCL_IB_DISABLE=1", _has("ib-disabled-by-env")),
    (r"SOCKET_IFNAME=lo", _has("bad-socket-ifname")),
    (r"NCCL_P2P_LEVEL=LOC", _has("p2p-disabled", "warning")),
    (r"INTRA-NODE traffic", _has("nvlink-unused")),
    (r"MIXED link layers", _has("mixed-link-layer")),
    (r"INTERLEAVED", _has("ranks-interleaved", "info")),
    (r"GDR is ON", _summary("gdr", lambda m: True)),
    (r"NCCL_P2P_LEVEL=SYS", _has("p2p-pcie-risk")),
    (r"NCCL_NET_GDR_LEVEL set by environment to LOC", _has("gdr-disabled-by-env")),
    (r"NVLS unavailable.*informational", _has("nvls-unavailable", "info")),
    (r"\b(\d+) nodes \(", _summary("nodes", lambda m: int(m.group(1)))),
    (r"ranks on (\d+) nodes", _summary("nodes", lambda m: int(m.group(1)))),
    (r"\bsingle node\b", _summary("nodes", lambda m: 1)),
    (r"(\d+) GPUs (?:each|per node)", _summary("gpus_per_node", lambda m: int(m.group(1)))),
    (r"\) x (\d+) H100", _summary("gpus_per_node", lambda m: int(m.group(1)))),
    (r"NCCL version (\d+\.\d+\.\d+)", _version),
    (r"P2P/CUMEM", lambda m, r: _contains("intra_node_transport", "P2P/CUMEM")(m, r)),
    (r"Intra-node: SHM", lambda m, r: _contains("intra_node_transport", "SHM")(m, r)),
    (r"P2P/IPC/read", lambda m, r: _contains("intra_node_transport", "P2P/IPC")(m, r)),
    (r"NOT a socket fallback", _lacks("net-socket-internode")),
    (r"RDMA-capable fabric", _plugin),
    (r'do NOT flag as "too many"', _lacks("few-channels")),
    (r"GPUDirect RDMA effectively DISABLED", _summary("gdr", lambda m: False)),
    (r"NVLS multicast support IS available", _lacks("nvls-unavailable")),
]


def _log_header(path: Path) -> str:
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if "BEGIN VERBATIM LOG" in line:
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def _analyse(logs: list[Path], xmls: list[Path]) -> dict[str, Any]:
    inputs = read_inputs(logs, xmls)
    assert inputs.used and not inputs.problems, inputs.problems
    sections, findings = diagnose(inputs.log, inputs.systems)
    return {"summary": sections["summary"], "sections": sections, "findings": findings}


def _log_files() -> list[str]:
    return sorted(p.name for p in LOGS.glob("*")) if LOGS.is_dir() else ["(no ../shared)"]


@pytest.mark.parametrize("name", _log_files())
def test_shared_log_header_expectations(name: str) -> None:
    if not LOGS.is_dir():
        pytest.skip("../shared not present")
    path = LOGS / name
    header = _log_header(path)
    assert "expected findings:" in header
    report = _analyse([path], [])
    matched = 0
    for pattern, check in LOG_EXPECT:
        m = re.search(pattern, header, re.IGNORECASE if pattern.startswith(r"\bsingle") else 0)
        if m:
            check(m, report)
            matched += 1
    assert matched >= 2, f"{name}: header phrases not covered by the expectation table"


def _readme_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    readme = TOPO / "README.md"
    for line in readme.read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 3 or not cells[0].endswith(".xml"):
            continue
        for name in re.split(r",\s*", cells[0]):
            m = re.match(r"(.*)\{(.*)\}(.*)", cells[0])
            names = [f"{m.group(1)}{x}{m.group(3)}" for x in m.group(2).split(",")] if m else [name]
            for n in names:
                rows[n] = cells[2]
    return rows


XML_EXPECT: list[tuple[str, Check]] = [
    (r'numaid="-1"', _has("numa-unknown")),
    (r"link_speed downgraded", _has("pcie-link-degraded")),
    (r"speed mismatch", _has("nic-speed-mismatch")),
    (r"must not treat these as real x1 links", _lacks("pcie-link-degraded")),
    (r"GPU and NIC hang directly off the CPU", _has("gdr-disabled")),
    (r"PIX distance \(ideal for GDR\)", _lacks("gdr-disabled")),
]


def _xml_files() -> list[str]:
    return sorted(p.name for p in TOPO.glob("*.xml")) if TOPO.is_dir() else ["(no ../shared)"]


@pytest.mark.parametrize("name", _xml_files())
def test_shared_topology_files(name: str) -> None:
    if not TOPO.is_dir():
        pytest.skip("../shared not present")
    path = TOPO / name
    text = path.read_text()
    comment = re.match(r"\s*<!--(.*?)-->", text, re.DOTALL)
    header = " ".join((comment.group(1) if comment else "").split())
    kind = _readme_rows().get(name, "")
    report = _analyse([], [path])
    topo = report["sections"]["topology"][0]
    # Truncation must be reported exactly for the excerpts the README calls partial / NOT well-formed.
    assert topo["truncated"] == ("NOT well-formed" in header or "partial" in kind), (name, header, kind)
    if "NCCL_GRAPH_FILE" in kind or "graph" in name:
        assert topo["kind"] == "graph" and topo["graphs"]
    else:
        assert topo["kind"] == "topology"
    if "no gpu/net children" in kind:
        assert topo["gpus"] == 8 or name.startswith("aws-ofi-nccl_g5") or isinstance(topo["gpus"], int)
    if m := re.search(r"(\d+) EFA NICs", kind):
        assert len(topo["nics"]) == int(m.group(1))
    if m := re.search(r"\((\d+)x \w+ \+ (\d+)x [\w ]+NIC, (\d+) NUMA\)", kind):
        assert (len(topo["gpus"]), len(topo["nics"]), len(topo["numa_nodes"])) == tuple(int(x) for x in m.groups())
    for pattern, check in XML_EXPECT:
        if mm := re.search(pattern, header):
            check(mm, report)

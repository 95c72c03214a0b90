"""Fabric findings from NCCL topology XML: GDR flags and distance, NIC/NUMA placement, PCIe links, NIC speeds."""

from __future__ import annotations

from collections import defaultdict

from ddpdoctor.findings.model import Finding, Severity
from ddpdoctor.topo.topo_xml import TopoGpu, TopoNet, TopoSystem, gt_per_s, nearest_nic

# PCIe generation a GPU of this compute capability is built for (GT/s): V100 Gen3, A100 Gen4, H100+ Gen5.
_EXPECTED_GT = {70: 8.0, 80: 16.0, 90: 32.0, 100: 32.0}


def _where(s: TopoSystem, line: int) -> str:
    return f"{s.file}:{line}"


def _gpu(s: TopoSystem, g: TopoGpu) -> str:
    return f"{_where(s, g.line)}: gpu dev={g.dev} busid={g.busid} sm={g.sm} gdr={int(bool(g.gdr))}"


def _net(s: TopoSystem, n: TopoNet) -> str:
    return f"{_where(s, n.line)}: net {n.name} dev={n.dev} speed={n.speed_mbps} gdr={int(bool(n.gdr))}"


def gdr_flags(s: TopoSystem) -> list[Finding]:
    off = [_gpu(s, g) for g in s.gpus if g.gdr is False]
    off += [_net(s, n) for n in s.nets if n.gdr is False and n.nic_busid is not None]
    far = []
    rdma = [n for n in s.nets if n.gdr]
    if rdma:
        for g in s.gpus:
            near = nearest_nic(g, rdma)
            if near and near[0] in ("PHB", "SYS"):
                far.append(f"{_gpu(s, g)} nearest RDMA NIC {near[1].name} at {near[0]}")
    if not off and not far:
        return []
    title = "GPUDirect RDMA unavailable in the topology" if off else (
        "GPU and NIC meet only at the CPU (PHB/SYS): NCCL's default NCCL_NET_GDR_LEVEL=PXB refuses GDR")
    return [Finding(
        "gdr-disabled", Severity.WARNING, title,
        evidence={"file": s.file, "lines": (off + far)[:6]},
        advice="gdr=0: load nvidia-peermem or use DMA-BUF; GPU/NIC only meeting at the CPU (common in VMs that hide "
        "PCIe switches): pass the real topology (NCCL_TOPO_FILE) or set NCCL_NET_GDR_LEVEL=PHB after testing.",
    )]


def numa_placement(s: TopoSystem) -> list[Finding]:
    out: list[Finding] = []
    unknown = [c for c in s.cpus if c.get("numaid") == "-1"]
    if unknown:
        out.append(Finding(
            "numa-unknown", Severity.INFO, "The topology has no NUMA information (numaid=-1): typical inside a VM",
            evidence={"file": s.file, "cpus": len(s.cpus)},
            advice="Expose the host NUMA layout to the VM (or give NCCL the host's NCCL_TOPO_FILE) so proxy threads "
            "and NICs are placed next to their GPUs.",
        ))
    nets = [n for n in s.nets if n.nic_busid is not None]
    numa_with_nic = {n.numa for n in nets if n.numa is not None and n.numa >= 0}
    if len(nets) < 2 or not numa_with_nic:
        return out
    stranded = [g for g in s.gpus if g.numa is not None and g.numa >= 0 and g.numa not in numa_with_nic]
    if stranded:
        out.append(Finding(
            "nic-numa-mismatch", Severity.WARNING,
            f"{len(stranded)} GPU(s) have no NIC on their NUMA node: their network traffic crosses the CPU interconnect",
            evidence={"file": s.file, "gpu_numa": sorted({g.numa for g in stranded if g.numa is not None}),
                      "nic_numa": sorted(numa_with_nic), "lines": [_gpu(s, g) for g in stranded[:4]]},
            advice="Move NICs (or GPUs) so every NUMA node has one, or pin ranks to GPUs near a NIC; check NCCL_IB_HCA "
            "does not exclude the local NIC.",
        ))
    return out


def pcie_links(s: TopoSystem) -> list[Finding]:
    slow = []
    for g in s.gpus:
        gt = gt_per_s(g.link_speed)
        want = _EXPECTED_GT.get((g.sm or 0) // 10 * 10)
        if gt is not None and want is not None and gt < want:
            slow.append(f"{_gpu(s, g)} link {g.link_speed} (expected {want:g} GT/s)")
        elif g.link_width is not None and 0 < g.link_width < 16:
            slow.append(f"{_gpu(s, g)} link width x{g.link_width}")
    for n in s.nets:
        if n.link_width is not None and 0 < n.link_width < 8:
            slow.append(f"{_net(s, n)} link width x{n.link_width}")
    if not slow:
        return []
    return [Finding(
        "pcie-link-degraded", Severity.WARNING, "GPU/NIC PCIe links run below their generation or width",
        evidence={"file": s.file, "lines": slow[:6]},
        advice="Check `lspci -vv` LnkSta against LnkCap: a riser, BIOS setting or VM passthrough can drop a link to a "
        "lower generation/width, halving host<->GPU and GDR bandwidth.",
    )]


def nic_speeds(s: TopoSystem) -> list[Finding]:
    by_guid: dict[str, list[TopoNet]] = defaultdict(list)
    for n in s.nets:
        if n.guid and n.guid not in ("0", "0x0"):
            by_guid[n.guid].append(n)
    rdma = [n for n in s.nets if n.speed_mbps and n.speed_mbps > 0 and n.nic_busid is not None]
    speeds = {n.speed_mbps for n in rdma}
    same_nic = [ns for ns in by_guid.values() if len({n.speed_mbps for n in ns}) > 1]
    if len(speeds) <= 1 and not same_nic:
        return []
    lines = [_net(s, n) for ns in same_nic for n in ns] or [_net(s, n) for n in rdma[:4]]
    return [Finding(
        "nic-speed-mismatch", Severity.WARNING,
        "NIC ports run at different speeds" + (" on one adapter" if same_nic else ""),
        evidence={"file": s.file, "speeds_mbps": sorted(s for s in speeds if s), "lines": lines[:6]},
        advice="NCCL rings run at the slowest NIC's pace: fix the slow port (cable, switch port, `ibstat` rate) or "
        "leave it out with NCCL_IB_HCA.",
    )]


def few_nics(s: TopoSystem) -> list[Finding]:
    gpus = len(s.gpus) or s.pci_gpus
    nics = len({n.nic_busid for n in s.nets if n.nic_busid}) or s.pci_nics
    if s.truncated or gpus < 4 or not nics or nics * 2 >= gpus:
        return []
    return [Finding(
        "few-nics", Severity.WARNING, f"{nics} NIC(s) for {gpus} GPUs in {s.file}",
        evidence={"file": s.file, "gpus": gpus, "nics": nics},
        advice="Multi-node bandwidth per GPU is capped by the NICs: expect one NIC per one or two GPUs on training "
        "nodes; check NICs are not missing from the topology (down, filtered, not passed to the VM).",
    )]


def truncated(s: TopoSystem) -> list[Finding]:
    if not s.truncated:
        return []
    return [Finding(
        "topology-truncated", Severity.INFO, f"{s.file} is cut off: analysed what it contains",
        evidence={"file": s.file, "gpus": len(s.gpus), "nics": len(s.nets)},
        advice="Checks that need the whole machine (NIC counts) were skipped; attach the full NCCL_TOPO_DUMP_FILE.",
    )]


def xml_findings(systems: list[TopoSystem]) -> list[Finding]:
    out: list[Finding] = []
    for s in systems:
        if s.kind != "topology":
            out.extend(truncated(s))
            continue
        for rule in (gdr_flags, numa_placement, pcie_links, nic_speeds, few_nics, truncated):
            out.extend(rule(s))
    return out
